r"""Evaluate a CIFAR-10 training run: precision@1 on test_batch.bin.

    python -m examples.cifar10.eval --train_dir=/tmp/cifar10_train [--continuous]

The model, its weight EMA and the data folder are read from the run's
train_config.json, so --train_dir is all it needs. The latest checkpoint is evaluated
once, or with --continuous every new checkpoint as it appears, until the run's last step.
Weights are the exponential moving averages when the run kept them. Each pass logs a
progress line and writes 'precision_at_1' to TensorBoard under <train_dir>/eval.

Each test batch is split over --num_towers towers (unset: as many as the run trained on;
GPUs when the machine has them, else virtual CPU devices) by towerlib.build_eval_graph,
which sums the towers' per-example correct predictions exactly: the precision is the
one a single device gives, whatever the split.

A run folder that cannot be written (read-only, another user's) is evaluated all the
same: without --eval_dir the summary is not written, and the log says so.
"""

from examples.cifar10 import command_line, options

SCRIPT_FLAGS = options.EVAL_FLAGS
# --help and a bad flag answer here, from the flag tables, before TensorFlow loads.
command_line.parse_flags_before_tensorflow(__name__, SCRIPT_FLAGS)

import dataclasses  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from typing import Callable, List, Optional  # noqa: E402

import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from examples.cifar10 import data, data_source, input_pipeline, models, run_folder, script_runner  # noqa: E402  # noqa: E402

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
    num_towers: int = 1  # towers each test batch was split over


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


def restore_saver(run_config):
    """A Saver that loads the EMA weights into the model when the run kept them."""
    if run_config.ema_decay is not None:
        return tf.compat.v1.train.Saver(towerlib.ema_restore_map(run_config.ema_decay))
    return tf.compat.v1.train.Saver()


def eval_devices(run_config, num_towers: Optional[int] = None) -> List[str]:
    """The devices to evaluate on: ``num_towers`` of them, or as many as the run trained
    on (its train_config.json; 0 there: one per GPU, else 1), on this machine's devices
    (GPUs when it has them, else virtual CPU devices), whatever the run trained on.

    Raises:
      FlagError: a count below 1, or more GPUs than this machine has.
    """
    count = run_config.num_towers if num_towers is None else num_towers
    if num_towers is not None and num_towers < 1:
        raise options.FlagError(
            "--num_towers=%d: evaluate on at least one tower (unset: as many as the run "
            "trained on)." % num_towers
        )
    try:
        return towerlib.tower_devices(count or None)
    except ValueError as e:
        raise options.FlagError("--num_towers=%d: %s" % (count, e)) from e


def check_batches_fill_the_towers(total: int, batch_size: int, num_towers: int) -> None:
    """Every evaluation batch, the last one included, must give each tower an example.

    Raises:
      FlagError: naming a --eval_batch_size that works with this many towers.
    """
    if batch_size < 1:
        raise options.FlagError(
            "--eval_batch_size=%d: use a positive number of examples." % batch_size
        )
    if total < num_towers:
        raise options.FlagError(
            "--num_towers=%d: the test files hold %d examples, fewer than the towers. Fix: "
            "--num_towers=%d or fewer." % (num_towers, total, total)
        )
    last = total % batch_size
    if batch_size >= num_towers and not 0 < last < num_towers:
        return
    works = next(
        b for b in range(max(batch_size, num_towers), total + 1)
        if not 0 < total % b < num_towers
    )
    raise options.FlagError(
        "--eval_batch_size=%d over %d towers: the %d test examples leave a batch of %d, "
        "and every tower needs at least one example of each batch. Fix: "
        "--eval_batch_size=%d, or fewer --num_towers."
        % (batch_size, num_towers, total, last if batch_size >= num_towers else batch_size,
           works)
    )


def _model(run_config) -> models.CifarModel:
    return models.make_model(run_config.model, run_config.weight_decay,
                             run_config.bn_momentum)


def _few_steps_note(run_config, global_step: int) -> str:
    """A warning when the batch-norm moving statistics are still mostly their initial
    values (mean 0, variance 1): after n steps at momentum m, a fraction m**n of them."""
    initial = run_config.bn_momentum ** global_step
    if initial < 0.1:
        return ""
    return ("; NOTE: the batch-norm moving statistics have seen only %d step(s) at "
            "--bn_momentum=%g, %.0f%% of them still their initial values: train longer, "
            "or with a lower --bn_momentum" % (global_step, run_config.bn_momentum,
                                               100 * initial))


def summary_dir(train_dir: str, eval_dir: str = "") -> Optional[str]:
    """Where the eval script writes its summary: --eval_dir, else <train_dir>/eval when
    that can be written, else nowhere (a read-only run folder: said in the log).

    Raises:
      FlagError: --eval_dir was given and cannot be written.
    """
    folder = eval_dir or os.path.join(train_dir, "eval")
    try:
        towerlib.validate_config(train_dir=folder)  # towerlib's probe: try to write
    except towerlib.ConfigError as error:
        reason = error.problems[0].problem
        if eval_dir:
            raise options.flag_error("eval_dir", eval_dir, reason,
                                     "choose a folder this user can write.") from None
        logger.info("NOTE: %s; evaluating without writing the precision_at_1 summary. "
                    "Pass --eval_dir=<a writable folder> to keep it.", reason.rstrip("."))
        return None
    return folder


def _correct_predictions(model: models.CifarModel):
    """build_eval_graph's metric_fn: 1 for each example of the tower predicted right."""

    def metric_fn(inputs, ctx):
        images, labels = inputs
        predictions = tf.argmax(model.logits(images, ctx), axis=1, output_type=tf.int32)
        return {"correct": tf.cast(tf.equal(predictions, labels), tf.int32)}

    return metric_fn


def evaluate_checkpoint(
    checkpoint: str,
    run_config,
    test_files: data.SplitFiles,
    batch_size: int = 500,
    eval_dir: Optional[str] = None,
    log: Callable[[str], None] = logger.info,
    num_towers: Optional[int] = None,
) -> EvalResult:
    """Counts correct top-1 predictions of ``checkpoint`` over every test example once.

    Each batch is split over the towers (``num_towers``; None: as many as the run
    trained on), and towerlib.build_eval_graph sums the towers' per-example counts
    exactly, so the precision is the one a single device gives.
    """
    global_step = int(tf.train.load_variable(checkpoint, "global_step"))
    ema = run_config.ema_decay is not None
    devices = eval_devices(run_config, num_towers)
    total = test_files.num_examples
    check_batches_fill_the_towers(total, batch_size, len(devices))
    with tf.Graph().as_default():
        with tf.device("/device:CPU:0"):
            dataset = input_pipeline.eval_dataset(test_files, batch_size)
            images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        evaluation = towerlib.build_eval_graph(
            _correct_predictions(_model(run_config)), (images, labels), devices=devices
        )
        counts = [evaluation.totals["correct"], evaluation.examples]
        saver = restore_saver(run_config)  # the model's variables; the totals are local
        report_every = max(1, total // (PROGRESS_LINES + 1))
        correct = seen = 0
        next_report = report_every
        start = time.time()
        with tf.compat.v1.Session(config=towerlib.session_config(len(devices))) as session:
            saver.restore(session, checkpoint)
            session.run(tf.compat.v1.local_variables_initializer())
            while True:
                try:
                    session.run(evaluation.update_op)
                except tf.errors.OutOfRangeError:
                    break
                correct, seen = (int(n) for n in session.run(counts))
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
        "eval step %d: precision@1 = %.4f (%d/%d) on %s%s, %d tower(s), %.1f s"
        % (
            global_step,
            precision,
            correct,
            total,
            test_files.batches_dir,
            " [generated data]" if test_files.generated else "",
            len(devices),
            time.time() - start,
        )
        + (" with the moving-average weights" if ema else "")
        + _few_steps_note(run_config, global_step)
    )
    if eval_dir:
        write_scalar(eval_dir, "precision_at_1", precision, global_step)
    return EvalResult(precision, correct, total, global_step, checkpoint, ema, len(devices))


def _load_run(train_dir: str, data_dir: Optional[str]):
    run_config = run_folder.load(train_dir)
    _, _, test_files = data_source.prepare(
        data_dir or run_config.data_dir, train_dir, log=logger.info, need_train=False
    )
    return run_config, test_files


def evaluate_latest(
    train_dir: str,
    data_dir: Optional[str] = None,
    batch_size: int = 500,
    eval_dir: Optional[str] = None,
    num_towers: Optional[int] = None,
) -> EvalResult:
    """Evaluates the newest checkpoint in train_dir (on num_towers towers; None: as many
    as the run trained on).

    Raises:
      FlagError: train_dir holds no run or no checkpoint yet.
    """
    run_config, test_files = _load_run(train_dir, data_dir)
    # The newest checkpoint that reads back (a torn newest one is skipped), as training
    # restores it; not the state file's latest.
    checkpoint = run_folder.restorable_checkpoint(train_dir)
    if not checkpoint:
        raise options.FlagError(
            "No checkpoint in --train_dir=%r yet. Fix: train first (or use --continuous to "
            "wait for one)." % train_dir
        )
    return evaluate_checkpoint(
        checkpoint, run_config, test_files, batch_size, eval_dir, num_towers=num_towers
    )


def evaluate_continuously(
    train_dir: str,
    data_dir: Optional[str] = None,
    batch_size: int = 500,
    eval_dir: Optional[str] = None,
    interval_secs: int = 30,
    timeout_secs: int = 600,
    num_towers: Optional[int] = None,
):
    """Evaluates each new checkpoint until one at the run's last step has been evaluated,
    or none appears for ``timeout_secs``. Returns the last EvalResult (None if none)."""
    run_config, test_files = _load_run(train_dir, data_dir)
    last = None
    for checkpoint in tf.compat.v1.train.checkpoints_iterator(
        train_dir, min_interval_secs=interval_secs, timeout=timeout_secs
    ):
        # A torn newest checkpoint is skipped for the newest one that reads back.
        checkpoint = run_folder.restorable_checkpoint(train_dir)
        if checkpoint is None or (last is not None and checkpoint == last.checkpoint):
            continue
        last = evaluate_checkpoint(
            checkpoint, run_config, test_files, batch_size, eval_dir, num_towers=num_towers
        )
        # The run may have been restarted with a later last step: re-read its config.
        run_config = run_folder.load(train_dir)
        if last.global_step >= run_config.max_steps:
            logger.info("Reached the run's last step %d; done.", run_config.max_steps)
            break
    else:
        logger.info("No new checkpoint for %d s; stopping.", timeout_secs)
    return last


def check_eval_flags(flags):
    """The evaluation's own numbers, refused in one line before anything is read."""
    for name, minimum in (("eval_batch_size", 1), ("eval_interval_secs", 0),
                          ("eval_timeout_secs", 0)):
        value = getattr(flags, name)
        if value < minimum:
            raise options.flag_error(name, value, "use a number >= %d." % minimum)


def main():
    flags = options.FLAGS
    check_eval_flags(flags)
    eval_dir = summary_dir(flags.train_dir, flags.eval_dir)
    with run_folder.claiming(flags.train_dir):   # its events in <train_dir>/eval: the run's
        if flags.continuous:
            evaluate_continuously(flags.train_dir, flags.data_dir or None,
                                  flags.eval_batch_size, eval_dir, flags.eval_interval_secs,
                                  flags.eval_timeout_secs, num_towers=flags.num_towers)
        else:
            evaluate_latest(flags.train_dir, flags.data_dir or None, flags.eval_batch_size,
                            eval_dir, num_towers=flags.num_towers)


if __name__ == "__main__":
    command_line.define_script_flags(SCRIPT_FLAGS)
    script_runner.start(main)
