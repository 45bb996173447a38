"""Running the training step: a MonitoredTrainingSession loop.

The session restores the latest checkpoint in `train_dir` when there is one,
so a restarted job continues from its last saved global step.
"""

import logging
import time

import tensorflow as tf

logger = logging.getLogger("towerlib")


def _ensure_log_output():
    """Shows towerlib's INFO lines when the program configured no logging."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


class StepLogger(tf.compat.v1.train.SessionRunHook):
    """Logs step, loss, examples/sec and sec/batch every `every_n_steps` steps.

    Rates are measured over the steps since the previous log line, so the
    first line (which includes graph warm-up) is the only slow one.
    """

    def __init__(self, loss, global_step, every_n_steps=100, examples_per_step=None):
        self.loss = loss
        self.global_step = global_step
        self.every_n_steps = max(1, int(every_n_steps))
        self.examples_per_step = examples_per_step
        self.last_loss = None
        self.last_step = None
        self._steps_since_log = 0
        self._last_time = None

    def begin(self):
        self._last_time = time.time()

    def before_run(self, run_context):
        self._steps_since_log += 1
        return tf.compat.v1.train.SessionRunArgs([self.loss, self.global_step])

    def after_run(self, run_context, run_values):
        self.last_loss, self.last_step = run_values.results
        # global_step was read before the update it ran with.
        self.last_step += 1
        if self.last_step % self.every_n_steps and self._steps_since_log < self.every_n_steps:
            return
        now = time.time()
        sec_per_batch = (now - self._last_time) / self._steps_since_log
        rate = ""
        if self.examples_per_step:
            rate = f", {self.examples_per_step / sec_per_batch:.1f} examples/sec"
        logger.info("step %d, loss = %.4f%s, %.3f sec/batch",
                    self.last_step, self.last_loss, rate, sec_per_batch)
        self._steps_since_log = 0
        self._last_time = now


def run_training(train_graph, *, train_dir, max_steps, hooks=(),
                 session_config=None, master="", is_chief=True,
                 log_every_n_steps=100, save_checkpoint_steps=None,
                 save_checkpoint_secs=None, save_summaries_steps=100,
                 examples_per_step=None, scaffold=None):
    """Runs `train_graph.train_op` until global_step reaches `max_steps`.

    Args:
      train_graph: a TrainGraph from build_train_graph.
      train_dir: checkpoints and TensorBoard events go here; training resumes
        from the latest checkpoint found in it.
      max_steps: the global step to stop at (not a count of new steps).
      hooks: extra SessionRunHooks.
      session_config: e.g. towerlib.session_config(num_towers).
      master, is_chief: for distributed training; the chief alone writes.
      save_checkpoint_steps / save_checkpoint_secs: how often to checkpoint
        (default every 1000 steps); a final checkpoint is always written.
      save_summaries_steps: how often to write summaries (None: never).
      examples_per_step: the global batch size, for examples/sec.

    Returns:
      (global_step, loss) after the last step run.
    """
    if not isinstance(max_steps, int) or max_steps < 0:
        raise ValueError(f"max_steps must be an int >= 0, got {max_steps!r}.")
    if not train_dir:
        raise ValueError("train_dir is empty: give a directory for checkpoints and "
                         "summaries.")
    if save_checkpoint_steps is None and save_checkpoint_secs is None:
        save_checkpoint_steps = 1000
    _ensure_log_output()
    step_logger = StepLogger(train_graph.loss, train_graph.global_step,
                             log_every_n_steps, examples_per_step)
    all_hooks = [tf.compat.v1.train.StopAtStepHook(last_step=max_steps),
                 step_logger] + list(hooks)
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=master, is_chief=is_chief, checkpoint_dir=train_dir,
            scaffold=scaffold, hooks=all_hooks, config=session_config,
            save_checkpoint_steps=save_checkpoint_steps,
            save_checkpoint_secs=save_checkpoint_secs,
            save_summaries_steps=save_summaries_steps,
            save_summaries_secs=None, log_step_count_steps=None) as session:
        while not session.should_stop():
            session.run(train_graph.train_op)
    return step_logger.last_step, step_logger.last_loss
