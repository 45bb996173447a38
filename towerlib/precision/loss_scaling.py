"""Loss scaling: float16 gradients that neither underflow nor reach the weights as Inf.

float16 keeps 5 exponent bits: gradients below 6e-8 flush to zero, above
65504 they become Inf. Multiplying the objective by a scale S (a power of 2,
e.g. 2**15) shifts every gradient the backward pass computes by S, out of
the underflow range; dividing the float32 gradients by S before the update
gives back the true gradient. When S is too large some gradient overflows;
that step is skipped (no weight, slot or global_step changes) and S goes
down. bfloat16 has float32's exponent range and needs no loss scaling.

One step with a DynamicLossScale (per step, shapes of the gradients unchanged):

    loss_scale = DynamicLossScale()                  # S = 2**15, in variable loss_scale/scale
    objective_i = loss_scale.scale(share_i * loss_i) # float32 scalar, times S, per tower
    grads_and_vars = optimizer.compute_gradients(objective_i) ... summed over towers
    pairs = loss_scale.unscale(grads_and_vars)       # each gradient / S (dense or sparse)
    finite = loss_scale.all_finite([g for g, _ in pairs])   # bool scalar
    train_op = loss_scale.apply_or_skip(
        finite, lambda: optimizer.apply_gradients(pairs, global_step=global_step),
        loss_is_finite=tf.math.is_finite(loss))

    step  gradients  what runs                    S after   good steps after
    1     finite     update, global_step 0 -> 1   2**15     1
    2     Inf        nothing (skipped)            2**14     0
    3..   finite     update each step             2**14     1, 2, ...
    after growth_interval (2000) good steps in a row: S = 2**15 again, count 0

A skipped step does not count as a step: global_step does not advance, so a
run to max_steps takes as many updates as without loss scaling, plus the
skipped ones. S never goes below `floor`; an overflow at the floor means the
model itself overflows in float16, which no scale fixes: `floor_reached`
says so for that step and towerlib.run.hooks.LossScaleFloorHook stops training with a
LossScaleFloorError (otherwise a run whose every step overflows would skip
forever and never reach max_steps).

Overflow or NaN loss? The two stay apart. A gradient overflow under loss
scaling is expected and handled here. A non-finite *loss* is a bug or a bad
batch, and must end as towerlib's NonFiniteError as it does without loss
scaling. So pass `loss_is_finite` (the unscaled loss of the step, e.g. every
tower's loss finite): when it is False the step is not treated as an
overflow, S and the count stay, and `apply_fn` runs, so that the NaN guard
in it (towerlib.guard_numerics, checking the loss it was given: the scaled
float32 objective, finite exactly when the loss is, for losses below
3.4e38 / S) fails the step with NonFiniteError and applies nothing; without
the guard, the update runs in memory and run_training's NonFiniteLossHook
raises before the step is saved, as without loss scaling. Keep the guard's
check_gradients=False with loss scaling: it sees the scaled gradients before
this class does and would call every overflow fatal.

Why tf.cond. Skipping means the optimizer's update ops must not run, and in
a graph only control flow can decide at run time not to run ops: gating the
gradients to zero would still decay Momentum and Adam's moments and count
the step; an Assert (the NaN guard's way) aborts the whole session.run, so
the scale could not go down. apply_fn is therefore built inside the true
branch of a tf.cond. The classic trap is the variables the optimizer creates
as it builds its update (Momentum and Adam slots, Adam's beta powers, the
guard's flags): made inside a branch, their initializers would only be
reachable through it. tf.compat.v1.train.Optimizer.apply_gradients creates
them under tf.init_scope, which leaves the branch and builds them in the
outer graph, so global_variables_initializer initializes them (tested with
Momentum, Adam and a guard_numerics-wrapped optimizer). In TF 2.21 tf.cond
is the functional If, lowered back to switch/merge in a Session; the update
ops keep their devices (a variable on /device:CPU:1 is updated there).
Not for towerlib.cluster's SyncReplicasOptimizer: a worker that skipped
would not push its gradients, and the other workers' step would wait for them.

The scale read: every use of S in a step (scale, unscale, the update of S)
reads the one tensor `value`, one read of the resource variable per
session.run, so the objective and the unscaling always use the same S, and S
is assigned only after the branch has run.
"""

import math
import numbers

import tensorflow as tf

from towerlib.precision.casting import loss_to_float32

__all__ = ["DynamicLossScale", "FixedLossScale", "LossScale", "LossScaleFloorError",
           "make_loss_scale"]


class LossScaleFloorError(FloatingPointError):
    """Gradients overflowed although the loss scale was at its floor.

    Attributes:
      step: the global step that could not be taken (every try was skipped).
      scale: the loss scale of those steps (the floor, or a FixedLossScale's value).
      overflows_in_a_row: how many steps in a row overflowed at the floor.
    """

    def __init__(self, step, scale, overflows_in_a_row):
        self.step = step
        self.scale = scale
        self.overflows_in_a_row = overflows_in_a_row
        super().__init__(
            f"Loss scaling could not avoid an overflow at step {step}: the gradients "
            f"held Inf or NaN in {overflows_in_a_row} step(s) in a row with the loss "
            f"scale at its lowest, {scale:g}, so each update was skipped and training "
            "made no progress (the loss itself was finite; a NaN loss is a "
            "NonFiniteError). The model overflows float16 (max 65504) by itself. "
            "Fix: compute in bfloat16 (float32's range, no loss scaling needed); or "
            "lower the learning rate; or find the op that overflows (a large sum, "
            "exp, or square) and compute it in float32.")


def _is_finite(gradient):
    """bool scalar: every element of a gradient (dense, or IndexedSlices' values) finite."""
    values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
    with tf.compat.v1.colocate_with(values.op):
        return tf.reduce_all(tf.math.is_finite(values))


class LossScale:
    """The interface; DynamicLossScale and FixedLossScale implement it.

    Build order within one graph: scale (per tower), unscale, all_finite,
    apply_or_skip (once). After apply_or_skip, `applied` and
    `floor_reached` are bool scalars of the step; fetch them with the train op.

    Attributes:
      value: float32 scalar, the scale this step uses.
      variables: the variables to save in checkpoints ([] for a fixed scale).
    """

    value = None
    variables = ()

    def __init__(self, scope):
        self._scope = scope            # the name scope ('loss_scale/') of its ops
        self._applied = None
        self._floor_reached = None

    def scale(self, objective):
        """objective (any float scalar) as float32, times the scale: float32 scalar."""
        with tf.name_scope("scaled_objective"):
            return loss_to_float32(objective) * self.value

    def unscale(self, grads_and_vars):
        """[(gradient / scale, variable)]: dense and IndexedSlices; None stays None.

        Each division runs beside its gradient (on the variable's device after
        towerlib's aggregation), in the gradient's dtype.
        """
        result = []
        with tf.name_scope(self._scope + "unscale/"):
            for gradient, variable in grads_and_vars:
                if gradient is None:
                    result.append((None, variable))
                    continue
                values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
                with tf.compat.v1.colocate_with(values.op):
                    values = values / tf.cast(self.value, values.dtype)
                if isinstance(gradient, tf.IndexedSlices):
                    values = tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
                result.append((values, variable))
        return result

    def all_finite(self, gradients):
        """bool scalar: every element of every gradient is finite (None ones skipped)."""
        with tf.name_scope(self._scope + "all_finite/"):
            flags = [_is_finite(g) for g in gradients if g is not None]
            return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)

    def apply_or_skip(self, all_finite, apply_fn, loss_is_finite=None):
        """An op running apply_fn() unless the gradients overflowed, then updating the scale.

        Args:
          all_finite: bool scalar, from all_finite(the unscaled gradients).
          apply_fn: builds the update, e.g. `lambda: optimizer.apply_gradients(
            pairs, global_step=global_step)`; called once, inside a tf.cond
            (see the module docstring: slots are still created outside it).
          loss_is_finite: bool scalar, the step's loss is finite, or None
            (taken as True). When False the step is no overflow: apply_fn
            runs so that the NaN guard raises NonFiniteError, and the scale
            stays.

        Returns:
          The step's op. With gradients that are not all finite (and a finite
          loss) apply_fn's ops do not run: weights, slots and global_step stay.
        """
        if self._applied is not None:
            raise RuntimeError("This loss scale already gates an update; create one "
                               "loss scale per training graph.")
        with tf.name_scope(self._scope + "apply_or_skip/"):
            loss_ok = (tf.constant(True) if loss_is_finite is None
                       else tf.convert_to_tensor(loss_is_finite))
            overflow = tf.logical_and(loss_ok, tf.logical_not(all_finite), name="overflow")
            good = tf.logical_and(loss_ok, all_finite, name="good")

            def apply():
                update = apply_fn()
                with tf.control_dependencies([update] if update is not None else []):
                    return tf.constant(True)

            self._applied = tf.cond(tf.logical_not(overflow), apply,
                                    lambda: tf.constant(False), name="applied")
            with tf.control_dependencies([self._applied]):
                scale_updates = self._update_scale(good, overflow)
            self._floor_reached = tf.logical_and(overflow, self._at_floor(),
                                                 name="floor_reached")
            return tf.group(self._applied, *scale_updates, name="step")

    @property
    def applied(self):
        """bool scalar: this step's update ran (False: skipped for an overflow)."""
        return self._after_apply_or_skip(self._applied)

    @property
    def floor_reached(self):
        """bool scalar: this step overflowed with the scale already at its lowest."""
        return self._after_apply_or_skip(self._floor_reached)

    def _after_apply_or_skip(self, tensor):
        if tensor is None:
            raise RuntimeError("Call apply_or_skip first: this tensor describes the "
                               "step it builds.")
        return tensor

    def _update_scale(self, good, overflow):
        """The ops updating the scale after the step (none for a fixed scale)."""
        raise NotImplementedError

    def _at_floor(self):
        """bool scalar: the scale of this step cannot go lower."""
        raise NotImplementedError


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")


class DynamicLossScale(LossScale):
    """A scale that halves on an overflow and doubles after many good steps.

    Variables (global, so checkpoints save them and a restart resumes with
    the scale it had): '<name>/scale' float32 scalar and '<name>/good_steps'
    int64 scalar, created in the current graph, name scope and device (put
    them on the host CPU or the parameter device).

    Args:
      initial: the starting scale; powers of 2 make scale and unscale exact.
      growth_interval: after this many good (applied) steps in a row the
        scale is multiplied by `factor` (if that stays finite in float32).
      factor: > 1; an overflow divides the scale by it.
      floor: the scale never goes below it (1.0: no scaling).
      name: name scope of the variables and ops.
    """

    def __init__(self, initial=2.0 ** 15, growth_interval=2000, factor=2.0, floor=1.0,
                 name="loss_scale"):
        _check_positive("initial", initial)
        _check_positive("floor", floor)
        _check_positive("factor", factor)
        if factor <= 1:
            raise ValueError(f"factor must be > 1 (the scale is divided by it on an "
                             f"overflow), got {factor!r}.")
        if floor > initial:
            raise ValueError(f"floor ({floor!r}) must be at most initial ({initial!r}).")
        if isinstance(growth_interval, bool) \
                or not isinstance(growth_interval, numbers.Integral) or growth_interval < 1:
            raise ValueError(f"growth_interval must be an int >= 1, got {growth_interval!r}.")
        self.initial, self.growth_interval = float(initial), int(growth_interval)
        self.factor, self.floor = float(factor), float(floor)
        with tf.name_scope(name) as scope:
            super().__init__(scope)
            self.scale_variable = tf.compat.v1.Variable(
                self.initial, dtype=tf.float32, trainable=False, name="scale",
                use_resource=True)
            self.good_steps = tf.compat.v1.Variable(
                0, dtype=tf.int64, trainable=False, name="good_steps", use_resource=True)
            self.value = tf.identity(self.scale_variable.read_value(), name="value")
        self.variables = (self.scale_variable, self.good_steps)

    def _update_scale(self, good, overflow):
        count = self.good_steps.read_value()
        grow = tf.logical_and(good, count + 1 >= self.growth_interval)
        grown = self.value * self.factor
        lowered = tf.maximum(self.value / self.factor, self.floor)
        new_scale = tf.where(overflow, lowered, tf.where(
            tf.logical_and(grow, tf.math.is_finite(grown)), grown, self.value))
        zero = tf.zeros([], tf.int64)
        new_count = tf.where(tf.logical_or(overflow, grow), zero,
                             tf.where(good, count + 1, count))
        return [self.scale_variable.assign(new_scale, read_value=False),
                self.good_steps.assign(new_count, read_value=False)]

    def _at_floor(self):
        return self.value <= self.floor


class FixedLossScale(LossScale):
    """A constant scale: every gradient divided by it, an overflowing step skipped.

    A fixed scale cannot go down, so an overflow is skipped (no non-finite
    update reaches the weights) but the scale stays, and the next batch may
    overflow again; every overflow is at the floor (`floor_reached`).

    Args:
      value: the scale, > 0 (a power of 2 makes scale and unscale exact).
      name: name scope of the ops.
    """

    def __init__(self, value, name="loss_scale"):
        _check_positive("value", value)
        with tf.name_scope(name) as scope:
            super().__init__(scope)
            self.value = tf.constant(float(value), tf.float32, name="value")
        self.variables = ()

    def _update_scale(self, good, overflow):
        del good, overflow
        return []

    def _at_floor(self):
        return tf.constant(True)


def make_loss_scale(loss_scale):
    """The LossScale for a build option, created in the current graph; or None.

    Args:
      loss_scale: None (no loss scaling), 'dynamic' (DynamicLossScale's
        defaults), a number (FixedLossScale(number)), or a LossScale built
        in the current graph (custom parameters).
    """
    if loss_scale is None or isinstance(loss_scale, LossScale):
        if loss_scale is not None and loss_scale.value.graph is not tf.compat.v1.get_default_graph():
            raise ValueError("loss_scale was created in another graph; create it in "
                             "the graph of the training step.")
        return loss_scale
    if loss_scale == "dynamic":
        return DynamicLossScale()
    if isinstance(loss_scale, numbers.Real) and not isinstance(loss_scale, bool):
        return FixedLossScale(loss_scale)
    raise ValueError(
        f"loss_scale must be None, 'dynamic', a number or a towerlib.precision.loss_scaling."
        f"LossScale, got {loss_scale!r}. Fix: 'dynamic' with precision='float16'; "
        "None with 'bfloat16' or 'float32', which do not need it.")
