"""NaN/Inf guard: a non-finite loss (or gradient) stops training before the update.

`guard_numerics(optimizer)` wraps the optimizer given to `build_train_graph`.
`build_train_graph` calls `compute_gradients` once per tower (inside the
tower's name scope and on its device) and `apply_gradients` once; the
wrapper records, per tower, whether the tower's objective (its weighted loss,
plus the regularization in tower 0) is finite and, when asked, whether each
of its gradients is, then makes every gradient handed to the real
`apply_gradients` pass through an identity that has a control dependency on
an Assert over all those flags. When a flag is false the Assert fails, so no
optimizer update, slot update, `global_step` increment or EMA update runs in
that `session.run`: the weights in memory stay those of the last good step.
(Moving statistics of towerlib batch norm are updated beside the optimizer,
not after it, and may already hold the bad batch's statistics; training
stops without saving, so they never reach a checkpoint.)

`run_training` turns the Assert's InvalidArgumentError into a
`NonFiniteError` naming the step, the towers and, for gradients, the
variables. Without the wrapper, `run_training` falls back to
`NonFiniteLossHook`, which sees the tower losses of the step just run: the
update has then been applied in memory, but the hook raises before the
checkpoint hook runs, so it is never saved.
"""

import logging
import re

import numpy as np
import tensorflow as tf

from towerlib.internals import error_texts

logger = logging.getLogger("towerlib")

_TOWER_SCOPE = re.compile(r"(?:^|/)tower_(\d+)(?:/|$)")


class NonFiniteError(FloatingPointError):
    """A tower's loss or gradient was NaN or Inf.

    Attributes:
      step: the global step the failed update would have produced (the step
        number StepLogger prints).
      problems: one sentence per tower (and gradient) at fault.
      applied: whether the update of that step reached the variables in
        memory (never a checkpoint).
      last_checkpoint: the newest checkpoint, all of whose values are from
        good steps, or None.
    """

    def __init__(self, step, problems, applied, last_checkpoint=None):
        self.step = step
        self.problems = list(problems)
        self.applied = applied
        self.last_checkpoint = last_checkpoint
        super().__init__(self._message())

    def with_last_checkpoint(self, prefix):
        return NonFiniteError(self.step, self.problems, self.applied, prefix)

    def _message(self):
        lines = [f"Non-finite values at step {self.step}:"]
        lines += [f"  - {problem}" for problem in self.problems]
        if self.applied:
            lines.append(
                "The update of this step ran in memory, but training stopped before "
                "saving it. To block such an update in the graph, build with "
                "optimizer=towerlib.guard_numerics(optimizer).")
        else:
            lines.append("The update of this step was not applied: the weights are "
                         "those of the step before.")
        where = (f"the last good checkpoint, {self.last_checkpoint}"
                 if self.last_checkpoint else "the last good checkpoint")
        lines.append(
            "Fix: lower the learning rate or clip the gradients, check the input "
            f"batch of step {self.step} for NaN/Inf or out-of-range values, then "
            f"restart: training resumes from {where}.")
        return "\n".join(lines)


def _tower_index_from_scope(default):
    match = _TOWER_SCOPE.search(tf.compat.v1.get_default_graph().get_name_scope())
    return int(match.group(1)) if match else default


def _is_finite(value):
    """bool scalar: every element of a tensor (or IndexedSlices' values) is finite."""
    if isinstance(value, tf.IndexedSlices):
        value = value.values
    return tf.reduce_all(tf.math.is_finite(value))


def _gate(gradient, gate_op):
    """`gradient` again, but only available after `gate_op` has run."""
    if gradient is None:
        return None
    values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
    with tf.device(values.device), tf.control_dependencies([gate_op]):
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(tf.identity(gradient.values),
                                    tf.identity(gradient.indices),
                                    gradient.dense_shape)
        return tf.identity(gradient)


class _TowerCheck:
    """What one compute_gradients call (one tower) is checked for."""

    def __init__(self, tower, device, loss_finite, gradient_finite, variables):
        self.tower = tower
        self.device = device
        self.loss_finite = loss_finite          # bool scalar
        self.gradient_finite = gradient_finite  # [bool scalar], one per variable
        self.variables = variables


class NumericsGuardOptimizer(tf.compat.v1.train.Optimizer):
    """An optimizer wrapper whose update does not run on a non-finite step.

    Use as `build_train_graph(model, inputs, guard_numerics(optimizer))`.
    One instance guards one `apply_gradients` (with the towers'
    `compute_gradients` calls before it); a second one is an error.
    """

    def __init__(self, optimizer, check_gradients=False, name="numerics_guard"):
        """
        Args:
          optimizer: the tf.compat.v1.train.Optimizer that does the update.
          check_gradients: also check every tower's gradients (one extra pass
            over the gradients per step); the loss is always checked.
          name: name scope of the check ops.
        """
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise TypeError(
                f"guard_numerics wraps a tf.compat.v1.train.Optimizer, got "
                f"{type(optimizer).__name__}.")
        super().__init__(use_locking=False, name=name)
        self.optimizer = optimizer
        self.check_gradients = check_gradients
        self._pending = []
        self.flags = None          # local bool variable [towers, 1 + gradients]
        self.assert_op = None
        self.marker = None
        self.global_step = None
        self.checks = []

    def compute_gradients(self, loss, var_list=None, **kwargs):
        grads_and_vars = self.optimizer.compute_gradients(loss, var_list=var_list, **kwargs)
        tower = _tower_index_from_scope(default=len(self._pending))
        with tf.name_scope(self._name):
            loss_finite = _is_finite(loss)
            gradient_finite = []
            if self.check_gradients:
                for gradient, _ in grads_and_vars:
                    gradient_finite.append(
                        tf.constant(True) if gradient is None else _is_finite(gradient))
        self._pending.append(_TowerCheck(
            tower, loss.device, loss_finite, gradient_finite,
            [v for _, v in grads_and_vars]))
        return grads_and_vars

    def check_totals(self, tower_losses, tower_grads_and_vars, devices):
        """Replaces the towers' checks by checks of their totals over a step.

        With gradient accumulation the towers' compute_gradients runs in a
        loop's body (towerlib.step.micro_loop), whose tensors the apply cannot
        read; a loss or gradient summed over the micro-batches is NaN or Inf
        when any micro-batch's was, so the totals are checked instead.
        """
        self._pending = []
        for index, (loss, pairs) in enumerate(zip(tower_losses, tower_grads_and_vars)):
            with tf.device(devices[index]), tf.name_scope(self._name):
                gradient_finite = ([tf.constant(True) if g is None else _is_finite(g)
                                    for g, _ in pairs] if self.check_gradients else [])
                self._pending.append(_TowerCheck(
                    index, devices[index], _is_finite(loss), gradient_finite,
                    [v for _, v in pairs]))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if self.assert_op is not None:
            raise RuntimeError(
                "This guard_numerics wrapper already guards an update; wrap the "
                "optimizer again for each train graph: guard_numerics(optimizer).")
        grads_and_vars = list(grads_and_vars)
        checks, self._pending = self._pending, []
        if not checks:
            # Gradients computed elsewhere: check the ones to apply, as "tower 0".
            checks = [_TowerCheck(0, "", tf.constant(True),
                                  [tf.constant(True) if g is None else _is_finite(g)
                                   for g, _ in grads_and_vars],
                                  [v for _, v in grads_and_vars])]
        widths = {len(c.gradient_finite) for c in checks}
        if len(widths) != 1:
            raise ValueError("The towers computed gradients for different numbers of "
                             f"variables ({sorted(widths)}); they must share one set.")
        self.checks, self.global_step = checks, global_step
        step = global_step if global_step is not None else tf.constant(-1, tf.int64)
        host = global_step.device if global_step is not None else checks[0].loss_finite.device
        with tf.name_scope(self._name) as scope, tf.device(host):
            flags = tf.stack([tf.stack([c.loss_finite] + c.gradient_finite)
                              for c in checks], name="finite_flags")
            self.flags = tf.compat.v1.Variable(
                np.ones([len(checks), 1 + widths.pop()], dtype=bool), trainable=False,
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                name="last_finite_flags")
            record = self.flags.assign(flags)
            with tf.control_dependencies([record]):
                # The marker names this guard in the error message: the Assert
                # runs inside a cond, so the error carries no op to compare.
                self.marker = f"towerlib numerics guard {scope.rstrip('/')}"
                self.assert_op = tf.debugging.Assert(
                    tf.reduce_all(flags),
                    [f"{self.marker}: a tower loss or gradient is NaN or Inf, the "
                     "update was not applied. global_step before the update:",
                     step, "finite flags [tower, (loss, gradients...)]:", flags],
                    summarize=64, name="check")
        gated = [(_gate(g, self.assert_op), v) for g, v in grads_and_vars]
        return self.optimizer.apply_gradients(gated, global_step=global_step, name=name)

    # Delegation, so that code asking the wrapper for slots gets the real ones.
    def get_slot(self, var, name):
        return self.optimizer.get_slot(var, name)

    def get_slot_names(self):
        return self.optimizer.get_slot_names()

    def variables(self):
        return self.optimizer.variables()

    def is_guard_error(self, error):
        """Whether an error from session.run is this guard's Assert failing."""
        if self.assert_op is None or not isinstance(error, tf.errors.InvalidArgumentError):
            return False
        return error_texts.names_assert(error, f"{self.marker}:")

    def failure(self, session):
        """The NonFiniteError for the step whose Assert failed in `session`.

        Reads the flags the failed step recorded and the (unchanged) global step.
        """
        flags = session.run(self.flags)
        step = int(session.run(self.global_step)) + 1 if self.global_step is not None else -1
        problems = []
        for check, row in zip(self.checks, flags):
            where = f"tower {check.tower}" + (f" ({check.device})" if check.device else "")
            if not row[0]:
                problems.append(f"{where}: the loss is NaN or Inf")
            bad = [v.op.name for v, ok in zip(check.variables, row[1:]) if not ok]
            if bad:
                problems.append(f"{where}: the gradient of {', '.join(bad)} has NaN or Inf")
        return NonFiniteError(step, problems or ["(flags were all finite; see the "
                                                 "InvalidArgumentError)"], applied=False)


def guard_numerics(optimizer, check_gradients=False):
    """Wraps `optimizer` so that a non-finite step's update never runs.

    Args:
      optimizer: a tf.compat.v1.train.Optimizer.
      check_gradients: also check each tower's gradients, naming the variable.

    Returns:
      A NumericsGuardOptimizer to pass to build_train_graph.
    """
    return NumericsGuardOptimizer(optimizer, check_gradients=check_gradients)


def guards_in(optimizer):
    """The NumericsGuardOptimizers in `optimizer`: itself, or inside a wrapper.

    A wrapper (towerlib.cluster's SyncReplicasTowerOptimizer) names the
    optimizer it wraps `wrapped_optimizer`. build_train_graph records the
    answer on TrainGraph.numerics_guards, which is how run_training knows to
    translate the guard's failure.
    """
    found = []
    while optimizer is not None:
        if isinstance(optimizer, NumericsGuardOptimizer):
            found.append(optimizer)
        optimizer = getattr(optimizer, "wrapped_optimizer", None)
    return found
