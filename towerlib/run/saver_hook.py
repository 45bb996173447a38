"""CrashSafeSaverHook: a checkpoint of every n steps, never of a non-finite state.

run_training adds it last among towerlib.run.hooks (which re-exports it), so that
every check of a step runs before the step is saved.
"""

import logging

import tensorflow as tf

from towerlib.precision.guards import NonFiniteError
from towerlib.run import checkpoints
from towerlib.update import slot_shards

logger = logging.getLogger("towerlib")

__all__ = ["CrashSafeSaverHook", "FiniteCheck"]


class CrashSafeSaverHook(tf.compat.v1.train.SessionRunHook):
    """Saves with a CheckpointWriter every N steps or seconds, and at the end.

    Saves once right after the session is created (unless that step already
    has a checkpoint, as after a restore; with slots sharded over workers, whose
    every save is an exchange all workers join, only at step 0, and a step saved
    before is saved over: towerlib.update.slot_shards), and at `end`, which
    MonitoredSession calls only when training stops without an exception:
    a step that raised (e.g. a non-finite loss) is never saved. Put this hook
    after every hook that can raise, so that a check failing in `after_run`
    stops the save of that same step.

    Before each save, one run checks that every floating-point global variable
    is finite (one reduction per variable, on its device); a NaN or Inf raises
    NonFiniteError naming the variables and nothing is saved: a step whose
    loss was finite can still leave Inf weights (an Inf gradient, a momentum
    that diverges), and no checkpoint may hold them. With slots sharded over
    workers that run also sums every worker's count of non-finite slots, so
    all workers refuse the same save (Adam's v can overflow while the weights
    stay finite, and only its owner holds it).

    `stopped_by_signal` (a callable, true once a stop signal came) skips the
    save at `end` when the slots are sharded over workers: it needs every
    worker at the same step, and a signal reaches them at different steps.
    """

    def __init__(self, train_dir, scaffold, *, save_steps=None, save_secs=None,
                 max_to_keep=5, basename=checkpoints.DEFAULT_BASENAME, write_meta_graph=True,
                 stopped_by_signal=lambda: False):
        if (save_steps is None) == (save_secs is None):
            raise ValueError("Give exactly one of save_steps and save_secs.")
        self._train_dir = train_dir
        self._scaffold = scaffold
        self._timer = tf.compat.v1.train.SecondOrStepTimer(
            every_secs=save_secs, every_steps=save_steps)
        self._writer_options = dict(max_to_keep=max_to_keep, basename=basename,
                                    write_meta_graph=write_meta_graph)
        self._global_step = None
        self._finite = None  # a FiniteCheck, from begin
        self._stopped_by_signal = stopped_by_signal
        self.writer = None

    @property
    def last_saved(self):
        """The prefix of the newest complete checkpoint, or None."""
        return self.writer.latest if self.writer else None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        if self._global_step is None:
            raise RuntimeError("CrashSafeSaverHook needs a global step: create it "
                               "with tf.compat.v1.train.get_or_create_global_step().")
        self._finite = FiniteCheck(tf.compat.v1.get_default_graph())
        self._together = bool(slot_shards.saveables_of(tf.compat.v1.get_default_graph()))

    def _save(self, session, step):
        """Saves `step` unless a variable is NaN or Inf (then NonFiniteError)."""
        self._finite.check(session, step, "checkpoint", self.writer.latest)
        self.writer.save(session, step, replace=self._together)

    def after_create_session(self, session, coord):
        saver = self._scaffold.saver if self._scaffold is not None else None
        if saver is None:
            savers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
            if len(savers) != 1:
                raise RuntimeError(
                    f"Found {len(savers)} savers in the SAVERS collection; pass a "
                    "Scaffold with the saver to use.")
            saver = savers[0]
        self.writer = checkpoints.CheckpointWriter(saver, self._train_dir, **self._writer_options)
        step = int(session.run(self._global_step))
        if not (self._together and step > 0):
            self._save(session, step)
        self._timer.update_last_triggered_step(step)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        # The step read before the update; +1 is the step this run produced.
        if self._timer.should_trigger_for_step(run_values.results + 1):
            step = int(run_context.session.run(self._global_step))
            if self._timer.should_trigger_for_step(step):
                self._timer.update_last_triggered_step(step)
                self._save(run_context.session, step)

    def end(self, session):
        step = int(session.run(self._global_step))
        if step == self._timer.last_triggered_step():
            return
        if self._together and self._stopped_by_signal():
            logger.warning(
                "Stopped by a signal at step %d: not saved, since with the slots sharded "
                "over the workers a save needs every worker, and the others may be at "
                "another step. A restart resumes from %s.", step, self.writer.latest)
            return
        self._save(session, step)


# The flag of the slots sharded over the workers (Replicated(shard_update=True)): set
# on every worker when any worker's slot is not finite.
_SHARDED_SLOTS = "an optimizer slot sharded over the workers (held by one of them)"


class FiniteCheck:
    """Whether every floating-point global variable of a graph is finite, before a save.

    Built before the graph is finalized (a hook's `begin`): one reduction per
    variable, on its device; with slots sharded over workers also their flag,
    which every worker reads in the same run (slot_shards.finite_everywhere).
    """

    def __init__(self, graph):
        with graph.as_default():
            self._flags = {}
            for variable in tf.compat.v1.global_variables():
                if variable.dtype.base_dtype.is_floating:
                    with tf.device(variable.device), tf.name_scope("finite_before_save"):
                        self._flags[variable.op.name] = tf.reduce_all(
                            tf.math.is_finite(variable))
            if slot_shards.finite_of(graph) is not None:
                self._flags[_SHARDED_SLOTS] = slot_shards.finite_of(graph)

    def check(self, session, step, what, last_checkpoint):
        """Raises NonFiniteError naming the variables that hold NaN or Inf, and that
        the `what` ('checkpoint') of `step` was not saved."""
        if not self._flags:
            return
        bad = [name for name, ok in session.run(self._flags).items() if not ok]
        if not bad:
            return
        first = bad[0] if bad[0] == _SHARDED_SLOTS else f"the variable {bad[0]}"
        more = (f" (and {len(bad) - 1} more: {', '.join(bad[1:5])}"
                f"{', ...' if len(bad) > 5 else ''})" if len(bad) > 1 else "")
        raise NonFiniteError(
            step, [f"{first} holds NaN or Inf{more}: the {what} of step {step} was not "
                   "saved"], applied=True, last_checkpoint=last_checkpoint)
