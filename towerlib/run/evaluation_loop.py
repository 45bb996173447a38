"""Evaluation between training steps: the metric logged, the best kept, early stopping.

    evaluation = towerlib.Evaluation(
        towerlib.build_eval_graph(correct_fn, test_batches.get_next(), num_towers=2,
                                  reuse_variables=True),
        every_n_steps=500, metric="correct", initializer=test_batches.initializer,
        patience=4, min_delta=0.001)
    towerlib.run_training(train, train_dir=..., max_steps=..., evaluation=evaluation)

Every `every_n_steps` global steps (and never at step 0) the hook runs the
evaluation on every tower (build_eval_graph's exact totals), logs the values,
writes them to TensorBoard as 'eval/<name>' and, when `metric` improved by more
than `min_delta`, saves the weights to train_dir/best (one crash-safe
checkpoint; a `best` that is a link, a file, or a folder holding anything
towerlib does not write there is refused in one line before the first step,
never written through). After `patience` evaluations without an improvement it stops
training; the final checkpoint is written as after any stop.

The state (best value, its step, evaluations since) lives in three variables
that every checkpoint saves, so a restarted run keeps its patience count, and a
run that had stopped early stops again at once. Across all-reduce workers every
worker evaluates and the metric is averaged over them by one all-reduce before
the decision (`agree`), so every worker stops at the same step.

An evaluation taken while batch norm's moving statistics are still mostly
their initial values (momentum ** step > 0.5) logs one warning line naming
the share, the layers and the fix (towerlib.run.moving_statistics). Early
stopping counts an evaluation against its patience only once the statistics
are at most 5% initial (the rule of docs/large_batches.md), unless it
improves the best; the evaluation's line says when it is not counted.
"""

import copy
import logging
import math
import os

import numpy as np
import tensorflow as tf

from towerlib.run import (
    checkpoint_state,
    checkpoints,
    folder_lock,
    moving_statistics,
    run_entries,
    saver_hook,
)
from towerlib.update import slot_shards

logger = logging.getLogger("towerlib")

BEST_DIRNAME = "best"


class Evaluation:
    """What to evaluate during training, how often, and when to stop.

    Build it in the training graph, after build_train_graph and before
    run_training (its state variables join the checkpoints).

    Args:
      eval_graph: an EvalGraph from build_eval_graph(..., reuse_variables=True).
      every_n_steps: evaluate when the global step is a multiple of this.
      metric: the name in eval_graph.values that decides "best".
      higher_is_better: True for a precision, False for a loss (a bool: the
        string "False" is refused, not taken as True).
      initializer: an op run before each evaluation (the evaluation
        iterator's initializer); the evaluation runs update_op until the
        input ends. None: give num_batches (a repeating input).
      num_batches: run update_op this many times per evaluation.
      keep_best: save the best weights to train_dir/best.
      patience: stop after this many evaluations in a row without an
        improvement (None: never stop early).
      min_delta: an improvement is a change past the best by more than this.
    """

    def __init__(self, eval_graph, every_n_steps, metric, *, higher_is_better=True,
                 initializer=None, num_batches=None, keep_best=True, patience=None,
                 min_delta=0.0):
        _check_options(eval_graph, every_n_steps, metric, initializer, num_batches,
                       patience, min_delta)
        if not isinstance(higher_is_better, (bool, np.bool_)):
            raise TypeError(f"Evaluation: higher_is_better={higher_is_better!r}: give True "
                            "(a precision) or False (a loss), not a "
                            f"{type(higher_is_better).__name__}.")
        self.eval_graph = eval_graph
        self.every_n_steps = int(every_n_steps)
        self.metric = metric
        self.higher_is_better = bool(higher_is_better)
        self.initializer = initializer
        self.num_batches = num_batches
        self.keep_best = keep_best
        self.patience = patience
        self.min_delta = float(min_delta)
        with eval_graph.update_op.graph.as_default():
            self.state = _State.create()
        self.agree = None  # set by with_agreement

    def with_agreement(self, agree):
        """A copy deciding on agree(metric tensor): the value every worker shares.

        towerlib.cluster's all-reduce path gives the mean over the workers, one
        all-reduce in the training graph, so every worker stops at one step.
        """
        agreed = copy.copy(self)
        agreed.agree = agree
        return agreed

    def improved(self, value, best):
        """Whether `value` beats `best` by more than min_delta."""
        if self.higher_is_better:
            return value > best + self.min_delta
        return value < best - self.min_delta


def _check_options(eval_graph, every_n_steps, metric, initializer, num_batches,
                   patience, min_delta):
    """One clear error per wrong option, before anything is built."""
    if not hasattr(eval_graph, "values") or not hasattr(eval_graph, "update_op"):
        raise TypeError(f"Evaluation takes build_eval_graph's result, got "
                        f"{type(eval_graph).__name__}.")
    for name, value in (("every_n_steps", every_n_steps), ("patience", patience)):
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, (int, np.integer)) or value < 1):
            raise ValueError(f"Evaluation: {name}={value!r}: give an int >= 1.")
    if metric not in eval_graph.values:
        raise ValueError(f"Evaluation: metric={metric!r} is not one of the evaluation's "
                         f"values {sorted(eval_graph.values)}.")
    if (initializer is None) == (num_batches is None):
        raise ValueError(
            "Evaluation: give exactly one of initializer (the evaluation iterator's "
            "initializer: the input is read to its end) and num_batches (a repeating "
            "input read that many times).")
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(
            num_batches, (int, np.integer)) or num_batches < 1):
        raise ValueError(f"Evaluation: num_batches={num_batches!r}: give an int >= 1.")
    if not isinstance(min_delta, (int, float)) or not math.isfinite(min_delta) \
            or min_delta < 0:
        raise ValueError(f"Evaluation: min_delta={min_delta!r}: give a finite number >= 0.")


class _State:
    """The early-stopping state, in variables every checkpoint saves."""

    def __init__(self, best, best_step, since_best):
        self.best, self.best_step, self.since_best = best, best_step, since_best
        self.value = tf.compat.v1.placeholder(tf.float64, [], "best_value")
        self.step = tf.compat.v1.placeholder(tf.int64, [], "best_step")
        self.since = tf.compat.v1.placeholder(tf.int64, [], "since_best")
        self.assign = tf.group(best.assign(self.value), best_step.assign(self.step),
                               since_best.assign(self.since))

    @classmethod
    def create(cls):
        # best_step -1: no evaluation yet (no infinity: checkpoints hold finite values).
        with tf.compat.v1.variable_scope("towerlib_evaluation"), tf.device("/cpu:0"):
            def variable(name, value, dtype):
                return tf.compat.v1.get_variable(
                    name, initializer=tf.constant(value, dtype), trainable=False,
                    use_resource=True)
            return cls(variable("best", 0.0, tf.float64),
                       variable("best_step", -1, tf.int64),
                       variable("since_best", 0, tf.int64))


class EvaluationHook(tf.compat.v1.train.SessionRunHook):
    """Runs an Evaluation between steps (run_training adds it; see the module).

    Args:
      evaluation: the Evaluation.
      step_after_update: run_training's int64 scalar, the step a run produced.
      train_dir: the folder of train_dir/best (None: keep no best).
      scaffold: the run's Scaffold, whose Saver writes the best checkpoint.
      summary_writer: where 'eval/<name>' goes (None: nowhere).
      batch_norm_momenta: {layer: momentum} of the step's batch norm
        (towerlib.run.moving_statistics.layer_momenta): an evaluation taken
        while they are mostly their initial values is said so, and early
        stopping counts none taken while they are more than 5% initial.
    """

    def __init__(self, evaluation, step_after_update, train_dir=None, scaffold=None,
                 summary_writer=None, batch_norm_momenta=None):
        self._evaluation = evaluation
        self._momenta = dict(batch_norm_momenta or {})
        self._step_after = step_after_update
        self._train_dir = train_dir
        self._scaffold = scaffold
        self._summary_writer = summary_writer
        self._global_step = None
        self._values = None
        self._evaluated_step = None
        self._best_writer = None
        self._finite = None   # a saver_hook.FiniteCheck when it keeps the best
        self.stopped_early_at = None
        self.last_values = None

    def begin(self):
        self._check_best_folder()
        if self._evaluation.keep_best and self._train_dir and self._scaffold:
            self._finite = saver_hook.FiniteCheck(tf.compat.v1.get_default_graph())
        self._global_step = tf.compat.v1.train.get_global_step()
        values = self._evaluation.eval_graph.values
        metric = tf.cast(values[self._evaluation.metric], tf.float64)
        self._values = dict(values, _decided=(self._evaluation.agree or tf.identity)(metric))

    def after_create_session(self, session, coord):
        state = self._evaluation.state
        since = int(session.run(state.since_best))
        if self._evaluation.patience and since >= self._evaluation.patience:
            # Restored after an early stop: stopping the coordinator ends the loop
            # before its first step.
            self.stopped_early_at = int(session.run(self._global_step))
            logger.info("Early stopping was decided before this run (no improvement "
                        "in %d evaluations since step %d): nothing to train.", since,
                        int(session.run(state.best_step)))
            coord.request_stop()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._step_after)

    def after_run(self, run_context, run_values):
        step = int(run_values.results)
        # A float16 step skipped on an overflow leaves the global step where it was:
        # that step has been evaluated already.
        if step % self._evaluation.every_n_steps or step == self._evaluated_step:
            return
        self._evaluated_step = step
        session = run_context.session
        values = self._evaluate(session)
        self._record(session, step, values)
        if self._should_stop(session, step):
            run_context.request_stop()

    def _evaluate(self, session):
        evaluation = self._evaluation
        eval_graph = evaluation.eval_graph
        session.run(eval_graph.reset_op)
        if evaluation.initializer is None:
            for _ in range(evaluation.num_batches):
                session.run(eval_graph.update_op)
            return session.run(self._values)
        session.run(evaluation.initializer)
        while True:
            try:
                if eval_graph.inputs:
                    # The batch first, alone: the input's end then stops a run on the
                    # input's device, not one the towers' devices wait in (TensorFlow
                    # logs every receive such a run abandons).
                    batch = session.run(eval_graph.inputs)
                    session.run(eval_graph.update_op, dict(zip(eval_graph.inputs, batch)))
                else:
                    session.run(eval_graph.update_op)
            except tf.errors.OutOfRangeError:
                break
        return session.run(self._values)

    def _record(self, session, step, values):
        decided = float(values.pop("_decided"))
        self.last_values = values
        fresh = moving_statistics.fresh_statistics_line(
            self._momenta, step, f"evaluation at step {step}")
        state = self._evaluation.state
        best, best_step, since = session.run(
            [state.best, state.best_step, state.since_best])
        # A NaN or Inf metric is never an improvement, and never stored (no checkpoint
        # may hold a non-finite value).
        improved = math.isfinite(decided) and (
            best_step < 0 or self._evaluation.improved(decided, best))
        # A read on statistics still partly initial is no sign of a plateau.
        share = moving_statistics.largest_share(self._momenta, step)
        counted = share <= moving_statistics.SMALL_SHARE
        if improved:
            best, best_step, since = decided, step, 0
        elif counted:
            since += 1
        session.run(state.assign, {state.value: best, state.step: best_step,
                                   state.since: since})
        if improved:  # after the state: the best checkpoint holds it as of this step
            self._save_best(session, step)
        uncounted = bool(self._evaluation.patience) and not improved and not counted
        if fresh is not None:
            logger.warning("%s%s", fresh, " Early stopping does not count this evaluation."
                           if uncounted else "")
        note = (f"; early stopping does not count it: the moving statistics are still "
                f"{share:.0%} initial (it counts from {moving_statistics.SMALL_SHARE:.0%})"
                if uncounted and fresh is None else "")
        self._log(step, values, decided, best, best_step, note)
        self._summarize(step, values)

    def _log(self, step, values, decided, best, best_step, note=""):
        """The evaluation's line; across workers also the value the decision used."""
        own, agreed = "", ""
        if self._evaluation.agree is not None:
            own = " (this worker)"
            agreed = (f"; over every worker {self._evaluation.metric} {decided:.6g}, "
                      "which decides")
        logger.info("step %d: evaluation%s %s%s (best %s %.6g at step %d%s)", step, own,
                    ", ".join(f"{name} {float(v):.6g}" for name, v in sorted(values.items())),
                    agreed, self._evaluation.metric, best, best_step, note)

    def _summarize(self, step, values):
        if self._summary_writer is not None:
            summary = tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag=f"eval/{name}", simple_value=float(v))
                for name, v in sorted(values.items())])
            self._summary_writer.add_summary(summary, step)

    def _check_best_folder(self):
        """Refuses (run_entries.ControlEntryError, one line) a train_dir/best that is a
        link, not a folder, or a folder of a user's files; a FIFO in it too."""
        if not (self._evaluation.keep_best and self._train_dir):
            return
        best = os.path.join(str(self._train_dir), BEST_DIRNAME)
        run_entries.check_folder(best)
        if os.path.isdir(best):
            run_entries.ours(best, checkpoint_state.run_folder_name)
            folder_lock.refuse_linked_entries(best)

    def _save_best(self, session, step):
        if not (self._evaluation.keep_best and self._train_dir and self._scaffold):
            return
        self._check_best_folder()  # again: it may have changed since the start
        # As every save: nothing non-finite (a slot can be while the metric is not).
        self._finite.check(session, step, "best checkpoint", None)
        if self._best_writer is None:
            self._best_writer = checkpoints.CheckpointWriter(
                self._scaffold.saver, os.path.join(self._train_dir, BEST_DIRNAME), max_to_keep=1,
                write_meta_graph=False)
        # Slots sharded over workers: every worker's save joins the same exchange.
        self._best_writer.save(session, step,
                               replace=bool(slot_shards.saveables_of(session.graph)))

    def _should_stop(self, session, step):
        patience = self._evaluation.patience
        if not patience:
            return False
        state = self._evaluation.state
        since, best_step = session.run([state.since_best, state.best_step])
        if since < patience:
            return False
        self.stopped_early_at = step
        logger.info("Early stopping at step %d: %s has not improved by more than %g "
                    "in %d evaluations (best at step %d).", step,
                    self._evaluation.metric, self._evaluation.min_delta, since, best_step)
        return True
