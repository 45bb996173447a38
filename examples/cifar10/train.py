r"""Train a CIFAR-10 model on several towers (GPUs, or virtual CPU devices) with towerlib.

    python -m examples.cifar10.train --num_towers=2 --model=convnet \
        --global_batch_size=128 --train_epochs=20 --train_dir=/tmp/cifar10_train

One optimizer step consumes one GLOBAL batch, split over the towers; the learning-rate
schedule is stated in epochs of global batches, so it means the same for any tower count.
Logs step, loss, examples/sec and sec/batch; writes TensorBoard summaries (loss, total
loss, learning rate, training precision) and checkpoints to --train_dir, and a restarted
run continues from the last checkpoint's global step. Without --data_dir it trains on the
built-in generated data set and says so.
"""

import dataclasses
import logging
import sys
import time
from typing import List, Optional

import tensorflow as tf

import towerlib
from examples.cifar10 import config as config_lib
from examples.cifar10 import data, data_source, download, input_pipeline, options, schedule

logger = logging.getLogger("cifar10")

# The errors a user can fix from the command line; the scripts print them without a trace.
USER_ERRORS = (config_lib.ConfigError, data.DataError, download.DownloadError)


@dataclasses.dataclass
class TrainPlan:
    """Everything decided before the graph is built."""

    config: config_lib.TrainConfig
    devices: List[str]
    data_dir: str
    train_files: data.SplitFiles
    test_files: data.SplitFiles
    max_steps: int
    lr_schedule: schedule.LearningRateSchedule


@dataclasses.dataclass
class TrainResult:
    global_step: int  # where training stopped
    start_step: int  # where it started (> 0 when resumed from a checkpoint)
    loss: Optional[float]  # the last step's loss (None when no step ran)
    seconds: float  # wall time of the training loop
    plan: TrainPlan


def make_plan(config: config_lib.TrainConfig) -> TrainPlan:
    """Checks the flags, prepares and validates the data, and derives the schedule.

    Raises:
      ConfigError, DataError, DownloadError: a problem the user can fix, with the fix.
    """
    devices = config_lib.check(config)
    config_lib.check_compatible_with_saved(config)
    data_dir, train_files, test_files = data_source.prepare(
        config.data_dir,
        config.train_dir,
        config.download,
        config.download_url,
        log=logger.info,
    )
    examples = train_files.num_examples
    lr_schedule = schedule.make_schedule(  # its settings were checked by config_lib.check
        config.learning_rate,
        config.global_batch_size,
        examples,
        decay_epochs=config.lr_decay_epochs,
        decay_factor=config.lr_decay_factor,
        warmup_epochs=config.warmup_epochs,
        scale_with_batch=config.scale_lr_with_batch,
    )
    max_steps = config.max_steps
    if config.train_epochs > 0:
        max_steps = max(
            1,
            schedule.epochs_to_steps(
                config.train_epochs, examples, config.global_batch_size
            ),
        )
    return TrainPlan(
        config=config,
        devices=devices,
        data_dir=data_dir,
        train_files=train_files,
        test_files=test_files,
        max_steps=max_steps,
        lr_schedule=lr_schedule,
    )


def build_training(plan: TrainPlan):
    """Builds the input pipeline and the multi-tower training step in the default graph.

    Returns:
      (towerlib.TrainGraph, learning-rate tensor).
    """
    config = plan.config
    if config.seed is not None:
        tf.compat.v1.set_random_seed(config.seed)
    host = "/device:CPU:0"
    with tf.device(host):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.name_scope("input"):
            dataset = input_pipeline.train_dataset(
                plan.train_files,
                config.global_batch_size,
                config.resolved_augmentation(),
                seed=config.seed,
            )
            images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        learning_rate = plan.lr_schedule.tensor(global_step)
        if config.optimizer == "momentum":
            optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, config.momentum)
        else:
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    train_graph = towerlib.build_train_graph(
        config.make_model(),
        (images, labels),
        optimizer,
        devices=plan.devices,
        bn_mode=config.bn_mode,
        param_device=config.param_device,
        global_step=global_step,
        ema_decay=config.ema_decay,
        learning_rate=learning_rate,
    )
    return train_graph, learning_rate


def checkpoint_step(train_dir: str) -> int:
    """The global step of the latest checkpoint in train_dir, or 0 when there is none."""
    checkpoint = tf.train.latest_checkpoint(train_dir)
    if not checkpoint:
        return 0
    return int(tf.train.load_variable(checkpoint, "global_step"))


def _describe(plan: TrainPlan) -> str:
    config = plan.config
    per_tower, extra = divmod(config.global_batch_size, len(plan.devices))
    shares = (
        "%d per tower" % per_tower
        if not extra
        else "%d or %d per tower" % (per_tower + 1, per_tower)
    )
    steps_per_epoch = schedule.steps_per_epoch(
        plan.train_files.num_examples, config.global_batch_size
    )
    return (
        "Training %s on %d tower(s) %s, global batch %d (%s), bn_mode=%s, variables on "
        "%s; %d training examples = %.1f steps per epoch; learning rate %g (%s) with "
        "decays x%g at steps %s%s; until global step %d (%.1f epochs)."
        % (
            config.model,
            len(plan.devices),
            plan.devices,
            config.global_batch_size,
            shares,
            config.bn_mode,
            config.param_device,
            plan.train_files.num_examples,
            steps_per_epoch,
            plan.lr_schedule.base_rate,
            config.optimizer,
            config.lr_decay_factor,
            plan.lr_schedule.boundaries or "none",
            ", warm-up %d steps" % plan.lr_schedule.warmup_steps
            if plan.lr_schedule.warmup_steps
            else "",
            plan.max_steps,
            plan.max_steps / steps_per_epoch,
        )
    )


def train(config: config_lib.TrainConfig) -> TrainResult:
    """Runs (or resumes) training as ``config`` says; returns where it stopped."""
    plan = make_plan(config)
    # Saved with the data folder and last step actually used, for eval and export.
    saved_config = dataclasses.replace(
        config, data_dir=plan.data_dir, max_steps=plan.max_steps
    )
    config_lib.save(saved_config, config.train_dir)
    logger.info(_describe(plan))
    start_step = checkpoint_step(config.train_dir)
    if start_step:
        logger.info(
            "Resuming from the checkpoint in %s at global step %d.",
            config.train_dir,
            start_step,
        )
    if start_step >= plan.max_steps:
        logger.info(
            "Global step %d has reached the last step %d: nothing to train.",
            start_step,
            plan.max_steps,
        )
        return TrainResult(start_step, start_step, None, 0.0, plan)

    with tf.Graph().as_default():
        train_graph, _ = build_training(plan)
        start = time.time()
        global_step, loss = towerlib.run_training(
            train_graph,
            train_dir=config.train_dir,
            max_steps=plan.max_steps,
            session_config=towerlib.session_config(len(plan.devices)),
            log_every_n_steps=config.log_every_n_steps,
            save_checkpoint_steps=config.save_checkpoint_steps,
            save_summaries_steps=config.save_summaries_steps,
            examples_per_step=config.global_batch_size,
        )
        seconds = time.time() - start
    end_step = global_step if global_step is not None else start_step
    logger.info(
        "Trained from global step %d to %d in %.1f s (%.1f examples/sec overall, "
        "graph start-up included); checkpoints in %s.",
        start_step,
        end_step,
        seconds,
        (end_step - start_step) * config.global_batch_size / max(seconds, 1e-9),
        config.train_dir,
    )
    return TrainResult(
        end_step, start_step, None if loss is None else float(loss), seconds, plan
    )


def configure_logging():
    """INFO lines of this example and of towerlib, with a time stamp, on stderr."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True
    )
    tf_logger = tf.get_logger()
    tf_logger.setLevel(logging.WARNING)  # TF's own INFO chatter (hooks, savers)
    tf_logger.propagate = False  # it has its own handler; do not print its lines twice


def run_main(body):
    """Runs body() and turns a user error into one line on stderr and exit status 2."""
    configure_logging()
    try:
        body()
    except USER_ERRORS as e:
        sys.stderr.write("error: %s\n" % e)
        sys.exit(2)


def main(argv):
    if len(argv) > 1:
        raise SystemExit(
            "error: unexpected arguments %s; all settings are --flags." % argv[1:]
        )
    run_main(lambda: train(options.train_config_from_flags()))


if __name__ == "__main__":
    from absl import app
    from absl import flags as absl_flags

    options.define_train_flags()
    absl_flags.adopt_module_key_flags(options)  # list them in --help
    app.run(main)
