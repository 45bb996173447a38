"""The SessionRunHooks run_training puts around a step, in the order it adds them.

  StepLogger                step, loss, examples/sec, sec/batch (and to TensorBoard);
                            float16's skipped steps and loss scale
  StepSummaryHook           the graph's summaries every n steps and at the last one
  SessionKeeper             the raw session, to read a guard's flags after a failed step
  CollectiveFetchCheckHook  a partial fetch of collectives refused before it hangs
  NonFiniteLossHook         a non-finite tower loss stops training (no guard)
  LossScaleFloorHook        float16: a loss scale at its floor that still overflows stops it
  CrashSafeSaverHook        checkpoints through a CheckpointWriter; added last,
                            so that every check of a step runs before it is saved

Distributed training adds SyncReplicasInitHook (towerlib.cluster).
"""

import logging
import time

import numpy as np
import tensorflow as tf

from towerlib.exchange import safety
from towerlib.precision import loss_scaling
from towerlib.precision.guards import NonFiniteError
from towerlib.run.saver_hook import CrashSafeSaverHook

logger = logging.getLogger("towerlib")

__all__ = ["CollectiveFetchCheckHook", "CrashSafeSaverHook", "LossScaleFloorHook",
           "NonFiniteLossHook", "SessionKeeper", "StepLogger", "StepSummaryHook"]


class StepLogger(tf.compat.v1.train.SessionRunHook):
    """Logs step, loss, examples/sec and sec/batch every `every_n_steps` steps.

    Rates are measured over the steps since the previous log line, so the
    first line (which includes graph warm-up) is the only slow one.

    `examples_per_step` is the global batch size: an int, or an integer
    scalar tensor fetched with each step (a batch known only at run time;
    the examples of every step since the last line are added up). None
    logs no examples/sec.

    The step number: a plain fetch of `global_step` next to the train op may
    read it before or after the op's increment (nothing orders the two), so
    give `step_after_update`, a read of the step made after the update
    (`step_after_update(train_graph)`); without it the hook assumes the read
    came first and adds 1, which is off by one when it did not.

    With `loss_scale` (float16) each line names the scale, and a step
    skipped for an overflow gets a line of its own (it does not count).
    With `max_steps` each line ends with the progress and an estimate of the
    time left at the rate since the previous line:

        step 50, loss = 2.1043, 81.3 examples/sec, 1.574 sec/batch; 50/625, about 15m05s left
    With `summary_writer`, each line's rates also go to TensorBoard as
    'global_step/sec' and 'examples/sec'.
    """

    def __init__(self, loss, global_step, every_n_steps=100, examples_per_step=None,
                 step_after_update=None, loss_scale=None, summary_writer=None,
                 max_steps=None):
        self.loss = loss
        self.global_step = global_step
        self.step_after_update = step_after_update
        self.every_n_steps = max(1, int(every_n_steps))
        self.examples_per_step = examples_per_step
        self._fetches_examples = isinstance(examples_per_step, (tf.Tensor, tf.Variable))
        self.loss_scale = loss_scale
        self.summary_writer = summary_writer
        self.max_steps = max_steps
        self.last_loss = None
        self.last_step = None
        self._steps_since_log = 0
        self._examples_since_log = 0
        self._last_time = None

    def begin(self):
        self._last_time = time.time()

    def before_run(self, run_context):
        self._steps_since_log += 1
        step = (self.step_after_update if self.step_after_update is not None
                else self.global_step)
        fetches = {"loss": self.loss, "step": step}
        if self._fetches_examples:
            fetches["examples"] = self.examples_per_step
        if self.loss_scale is not None:
            fetches["applied"] = self.loss_scale.applied
            fetches["scale"] = self.loss_scale.value
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        if self.loss_scale is not None and not results["applied"]:
            self._steps_since_log -= 1
            logger.info("step %d skipped: float16 gradients overflowed at loss scale %g "
                        "(the update is dropped, the scale lowered)",
                        int(results["step"]) + 1,  # global_step did not move
                        results["scale"])
            return
        self.last_loss, self.last_step = results["loss"], int(results["step"])
        if self._fetches_examples:
            self._examples_since_log += int(results["examples"])
        elif self.examples_per_step:
            self._examples_since_log += self.examples_per_step
        if self.step_after_update is None:
            self.last_step += 1
        if self.last_step % self.every_n_steps and self._steps_since_log < self.every_n_steps:
            return
        now = time.time()
        elapsed = now - self._last_time
        sec_per_batch = elapsed / self._steps_since_log
        rate = ""
        if self._examples_since_log and elapsed > 0:
            rate = f", {self._examples_since_log / elapsed:.1f} examples/sec"
        if self.loss_scale is not None:
            rate += f", loss scale {results['scale']:g}"
        logger.info("step %d, loss = %.4f%s, %.3f sec/batch%s",
                    self.last_step, self.last_loss, rate, sec_per_batch,
                    _progress(self.last_step, self.max_steps, sec_per_batch))
        if self.summary_writer is not None and elapsed > 0:
            values = [tf.compat.v1.Summary.Value(
                tag="global_step/sec", simple_value=self._steps_since_log / elapsed)]
            if self._examples_since_log:
                values.append(tf.compat.v1.Summary.Value(
                    tag="examples/sec", simple_value=self._examples_since_log / elapsed))
            self.summary_writer.add_summary(tf.compat.v1.Summary(value=values),
                                            self.last_step)
        self._steps_since_log = 0
        self._examples_since_log = 0
        self._last_time = now


def _progress(step, max_steps, sec_per_batch):
    """'; 50/625, about 15m05s left', or '' without max_steps."""
    if not max_steps:
        return ""
    left = max(0, max_steps - step) * sec_per_batch
    hours, rest = divmod(int(round(left)), 3600)
    minutes, seconds = divmod(rest, 60)
    shown = f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
    return f"; {step}/{max_steps}, about {shown} left"


class StepSummaryHook(tf.compat.v1.train.SessionRunHook):
    """Writes the scaffold's summaries every `every_n_steps` global steps, the first and last.

    TensorFlow's SummarySaverHook misses the final step unless it falls on
    the period; here the step about to run is predicted from the step after
    the previous update, and `last_step` (run_training's max_steps) always
    gets its point. The summary op is the scaffold's (its own, or the
    SUMMARY_OP collection, or every summary: resolved once the session
    exists), written under the step read after the update
    (`step_after_update`). A SessionLog START at the first write of each
    session makes TensorBoard drop a resumed run's orphaned points.
    """

    def __init__(self, scaffold, summary_writer, every_n_steps, last_step,
                 step_after_update):
        self._scaffold = scaffold
        self._writer = summary_writer
        self._every = max(1, int(every_n_steps))
        self._last_step = last_step
        self._step_after_update = step_after_update
        self._next_step = None
        self._started = False

    def after_create_session(self, session, coord):
        del session, coord
        self._next_step = None  # the first step always writes
        self._started = False

    def before_run(self, run_context):
        step = self._next_step
        wanted = step is None or step % self._every == 0 or step == self._last_step
        fetches = {"step": self._step_after_update}
        if wanted and self._scaffold.summary_op is not None:
            fetches["summary"] = self._scaffold.summary_op
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        step = int(run_values.results["step"])
        if "summary" in run_values.results:
            if not self._started:
                self._writer.add_session_log(
                    tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.START), step)
                self._started = True
            self._writer.add_summary(run_values.results["summary"], step)
        self._next_step = step + 1

    def end(self, session):
        del session
        self._writer.flush()


class SessionKeeper(tf.compat.v1.train.SessionRunHook):
    """Keeps the raw session, to read a guard's flags after a failed step."""

    session = None

    def after_create_session(self, session, coord):
        self.session = session


class CollectiveFetchCheckHook(tf.compat.v1.train.SessionRunHook):
    """Runs `towerlib.exchange.check_fetches` before each run of a MonitoredSession.

    The check runs once per distinct (fetches, feeds) signature, so a
    training loop pays for it on its first step only. Fetches that other
    hooks add are not checked.
    """

    def __init__(self):
        self._checked = set()

    def before_run(self, run_context):
        args = run_context.original_args
        graph = run_context.session.graph
        signature = (
            tuple(e.name for e in safety.graph_elements(args.fetches, graph)),
            tuple(sorted(e.name for e in safety.graph_elements(
                list(args.feed_dict or {}), graph))),
        )
        if signature not in self._checked:
            safety.check_fetches(args.fetches, args.feed_dict, graph)
            self._checked.add(signature)


class NonFiniteLossHook(tf.compat.v1.train.SessionRunHook):
    """Raises NonFiniteError when a tower's loss of the step just run is not finite.

    The fallback when the optimizer is not guarded: the update has run by the
    time the losses are seen, so this hook must come before the checkpoint
    hook, which then never saves that step.
    """

    def __init__(self, tower_losses, step_after_update, devices=None, names=None):
        """
        Args:
          tower_losses: float scalars, one per tower (TrainGraph.tower_losses).
          step_after_update: the global step read after the update
            (towerlib.run.trainer.step_after_update), to name the step.
          devices: tower device strings, for the message.
          names: what each loss is, for the message (default 'tower i').
        """
        self.tower_losses = list(tower_losses)
        self.step_after_update = step_after_update
        self.devices = list(devices) if devices else [""] * len(self.tower_losses)
        self.names = list(names) if names else [f"tower {i}" for i in range(len(self.tower_losses))]

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(
            [self.tower_losses, self.step_after_update])

    def after_run(self, run_context, run_values):
        losses, step = run_values.results
        bad = [i for i, loss in enumerate(losses) if not np.isfinite(loss)]
        if bad:
            problems = [self.names[i] + (f" ({self.devices[i]})" if self.devices[i] else "")
                        + f": the loss is {losses[i]}" for i in bad]
            raise NonFiniteError(int(step), problems, applied=True)


class LossScaleFloorHook(tf.compat.v1.train.SessionRunHook):
    """Raises LossScaleFloorError when the loss scale overflows at its floor.

    Fetches `floor_reached`, the scale and the global step with each run (of
    the train op: the hook's fetches need the step's gradients). Raising in
    after_run stops a MonitoredSession before the checkpoint hook that comes
    after it saves anything, like the NaN hooks.

    Args:
      loss_scale: the LossScale, after its apply_or_skip was built.
      overflows_in_a_row: how many consecutive overflows at the floor to
        allow before raising (1: the first; more tolerates a rare bad batch).
      global_step: the step variable (default: the graph's global step).
    """

    def __init__(self, loss_scale, overflows_in_a_row=1, global_step=None):
        if isinstance(overflows_in_a_row, bool) or not isinstance(overflows_in_a_row, int) \
                or overflows_in_a_row < 1:
            raise ValueError(f"overflows_in_a_row must be an int >= 1, got "
                             f"{overflows_in_a_row!r}.")
        self.loss_scale = loss_scale
        self.overflows_in_a_row = overflows_in_a_row
        self._global_step = global_step
        self._in_a_row = 0

    def begin(self):
        if self._global_step is None:
            self._global_step = tf.compat.v1.train.get_global_step()
        self._fetches = [self.loss_scale.floor_reached, self.loss_scale.value]
        if self._global_step is not None:
            self._fetches.append(self._global_step)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        floor_reached, scale = run_values.results[:2]
        self._in_a_row = self._in_a_row + 1 if floor_reached else 0
        if self._in_a_row >= self.overflows_in_a_row:
            # A skipped step leaves global_step as it was: the step not taken is +1.
            step = int(run_values.results[2]) + 1 if len(run_values.results) > 2 else -1
            raise loss_scaling.LossScaleFloorError(step, float(scale), self._in_a_row)
