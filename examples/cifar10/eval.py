r"""Evaluate a CIFAR-10 training run: precision@1 on test_batch.bin.

    python -m examples.cifar10.eval --train_dir=/tmp/cifar10_train [--continuous]

The model, its weight EMA and the data folder are read from the run's
train_config.json, so --train_dir is all it needs. The latest checkpoint is evaluated
once, or with --continuous every new checkpoint as it appears, until the run's last step.
Weights are the exponential moving averages when the run kept them. Each pass logs a
progress line and writes 'precision_at_1' to TensorBoard under <train_dir>/eval.
"""

import dataclasses
import logging
import os
import time
from typing import Callable, Optional

import tensorflow as tf

import towerlib
from examples.cifar10 import config as config_lib
from examples.cifar10 import data, data_source, input_pipeline, models, options
from examples.cifar10 import script_runner

logger = logging.getLogger("cifar10")

PROGRESS_LINES = 4  # progress lines per pass over the test set, besides the final one


@dataclasses.dataclass
class EvalResult:
    precision_at_1: float
    correct: int
    examples: int
    global_step: int
    checkpoint: str
    ema: bool  # evaluated with the weights' moving averages


def write_scalar(log_dir: str, tag: str, value: float, step: int) -> None:
    """Appends one scalar to the TensorBoard events in log_dir."""
    with tf.Graph().as_default():  # the v1 FileWriter needs graph mode
        writer = tf.compat.v1.summary.FileWriter(log_dir)
        writer.add_summary(
            tf.compat.v1.Summary(
                value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)]
            ),
            step,
        )
        writer.close()


def restore_saver(run_config: config_lib.TrainConfig):
    """A Saver that loads the EMA weights into the model when the run kept them."""
    if run_config.ema_decay is not None:
        return tf.compat.v1.train.Saver(towerlib.ema_restore_map(run_config.ema_decay))
    return tf.compat.v1.train.Saver()


def evaluate_checkpoint(
    checkpoint: str,
    run_config: config_lib.TrainConfig,
    test_files: data.SplitFiles,
    batch_size: int = 500,
    eval_dir: Optional[str] = None,
    log: Callable[[str], None] = logger.info,
) -> EvalResult:
    """Counts correct top-1 predictions of ``checkpoint`` over every test example once."""
    global_step = int(tf.train.load_variable(checkpoint, "global_step"))
    ema = run_config.ema_decay is not None
    with tf.Graph().as_default():
        with tf.device("/device:CPU:0"):
            dataset = input_pipeline.eval_dataset(test_files, batch_size)
            images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        logits = models.inference_logits(run_config.make_model(), images)
        predictions = tf.argmax(logits, axis=1, output_type=tf.int32)
        batch_correct = tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.int64))
        batch_examples = tf.size(labels)
        saver = restore_saver(run_config)
        total = test_files.num_examples
        report_every = max(1, total // (PROGRESS_LINES + 1))
        correct = seen = 0
        next_report = report_every
        start = time.time()
        with tf.compat.v1.Session(config=towerlib.session_config(1)) as session:
            saver.restore(session, checkpoint)
            while True:
                try:
                    batch_c, batch_n = session.run([batch_correct, batch_examples])
                except tf.errors.OutOfRangeError:
                    break
                correct += int(batch_c)
                seen += int(batch_n)
                if seen >= next_report and seen < total:
                    log(
                        "eval step %d: %d/%d examples, precision@1 so far %.4f"
                        % (global_step, seen, total, correct / seen)
                    )
                    next_report += report_every
    if seen != total:
        raise RuntimeError(
            "Evaluated %d examples but the test files hold %d." % (seen, total)
        )
    precision = correct / total
    log(
        "eval step %d: precision@1 = %.4f (%d/%d) on %s%s, %.1f s"
        % (
            global_step,
            precision,
            correct,
            total,
            test_files.batches_dir,
            " [generated data]" if test_files.generated else "",
            time.time() - start,
        )
        + (" with the moving-average weights" if ema else "")
    )
    if eval_dir:
        write_scalar(eval_dir, "precision_at_1", precision, global_step)
    return EvalResult(precision, correct, total, global_step, checkpoint, ema)


def _load_run(train_dir: str, data_dir: Optional[str]):
    run_config = config_lib.load(train_dir)
    _, _, test_files = data_source.prepare(
        data_dir or run_config.data_dir, train_dir, log=logger.info, need_train=False
    )
    return run_config, test_files


def evaluate_latest(
    train_dir: str,
    data_dir: Optional[str] = None,
    batch_size: int = 500,
    eval_dir: Optional[str] = None,
) -> EvalResult:
    """Evaluates the newest checkpoint in train_dir.

    Raises:
      ConfigError: train_dir holds no run or no checkpoint yet.
    """
    run_config, test_files = _load_run(train_dir, data_dir)
    checkpoint = tf.train.latest_checkpoint(train_dir)
    if not checkpoint:
        raise config_lib.ConfigError(
            "No checkpoint in --train_dir=%r yet. Fix: train first (or use --continuous to "
            "wait for one)." % train_dir
        )
    return evaluate_checkpoint(checkpoint, run_config, test_files, batch_size, eval_dir)


def evaluate_continuously(
    train_dir: str,
    data_dir: Optional[str] = None,
    batch_size: int = 500,
    eval_dir: Optional[str] = None,
    interval_secs: int = 30,
    timeout_secs: int = 600,
):
    """Evaluates each new checkpoint until one at the run's last step has been evaluated,
    or none appears for ``timeout_secs``. Returns the last EvalResult (None if none)."""
    run_config, test_files = _load_run(train_dir, data_dir)
    last = None
    for checkpoint in tf.compat.v1.train.checkpoints_iterator(
        train_dir, min_interval_secs=interval_secs, timeout=timeout_secs
    ):
        last = evaluate_checkpoint(checkpoint, run_config, test_files, batch_size, eval_dir)
        # The run may have been restarted with a later last step: re-read its config.
        run_config = config_lib.load(train_dir)
        if last.global_step >= run_config.max_steps:
            logger.info("Reached the run's last step %d; done.", run_config.max_steps)
            break
    else:
        logger.info("No new checkpoint for %d s; stopping.", timeout_secs)
    return last


def main(argv):
    flags = options.FLAGS
    eval_dir = flags.eval_dir or os.path.join(flags.train_dir, "eval")

    def body():
        if flags.continuous:
            evaluate_continuously(
                flags.train_dir,
                flags.data_dir or None,
                flags.eval_batch_size,
                eval_dir,
                flags.eval_interval_secs,
                flags.eval_timeout_secs,
            )
        else:
            evaluate_latest(
                flags.train_dir, flags.data_dir or None, flags.eval_batch_size, eval_dir
            )

    script_runner.run(argv, body)


if __name__ == "__main__":
    from absl import app
    from absl import flags as absl_flags

    options.define_eval_flags()
    absl_flags.adopt_module_key_flags(options)  # list them in --help
    app.run(main)
