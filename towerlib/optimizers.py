"""LARS and LAMB: layer-wise trust ratios for large global batches, as TF 1 optimizers.

    optimizer = towerlib.optimizers.LARSOptimizer(rate, momentum=0.9, weight_decay=5e-4)
    optimizer = towerlib.optimizers.LAMBOptimizer(rate, weight_decay=0.01)

Both scale each variable's step by a trust ratio ||w|| / ||update||. towerlib
applies them once per step to the combined gradient of the whole global
batch (every tower, micro-batch and worker), so the ratio is the global
gradient's, never a tower's; replicated copies compute it alike.

LARS (You et al. 2017): trust = eta * ||w|| / (||g|| + wd * ||w||);
v <- momentum * v + rate * trust * (g + wd * w); w <- w - v.
LAMB (You et al. 2019): Adam's bias-corrected moments m, v;
r = m_hat / (sqrt(v_hat) + epsilon) + wd * w; w <- w - rate * (||w|| / ||r||) * r.
When a norm is 0 the trust is 1, eta included: LARS takes trust 1 unless
||w|| > 0 and ||g|| > 0 (as TensorFlow 1's contrib LARSOptimizer and apex's LARC do, so a
zero-initialized matrix's first step is plain momentum SGD, not eta times it),
LAMB unless ||w|| > 0 and ||r|| > 0. Variables `excluded` (by default
those of rank <= 1: biases, batch-norm gamma and beta) take neither the
trust ratio nor weight decay. A sparse gradient is applied as its dense value
(its norm is the whole gradient's; the moments decay on every row).
"""

import math
import numbers

import tensorflow as tf

__all__ = ["LAMBOptimizer", "LARSOptimizer"]


def _default_excluded(variable):
    return variable.shape.rank is not None and variable.shape.rank <= 1


class _TrustRatioOptimizer(tf.compat.v1.train.Optimizer):
    """The parts LARS and LAMB share: exclusions, norms, dense application."""

    def __init__(self, learning_rate, weight_decay, excluded, use_locking, name):
        super().__init__(use_locking, name)
        _check_rate(learning_rate, type(self).__name__)
        _check_finite(name, weight_decay=weight_decay)
        if not weight_decay >= 0:
            raise ValueError(f"{name}: weight_decay must be >= 0, got {weight_decay!r}.")
        self._rate = learning_rate
        self._weight_decay = float(weight_decay)
        self._excluded = excluded or _default_excluded

    def _adapted(self, variable):
        return not self._excluded(variable)

    @staticmethod
    def _trust(numerator, denominator, norms):
        """numerator / denominator where every norm in `norms` is > 0, else 1."""
        ok = tf.reduce_all(tf.stack([n > 0 for n in norms]))
        return tf.where(ok, numerator / tf.where(ok, denominator, 1.0), 1.0)

    def _rate_for(self, variable):
        return tf.cast(tf.convert_to_tensor(self._rate), variable.dtype.base_dtype)

    def _resource_apply_dense(self, grad, handle):
        return self._apply_dense_update(grad, handle)

    def _apply_dense(self, grad, var):
        return self._apply_dense_update(grad, var)

    def _resource_apply_sparse(self, grad, handle, indices):
        dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(handle)[0])
        return self._apply_dense_update(dense, handle)

    def _apply_sparse(self, grad, var):
        dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(var)[0])
        return self._apply_dense_update(dense, var)


class LARSOptimizer(_TrustRatioOptimizer):
    """LARS with momentum (see the module docstring).

    The trust ratio is eta * ||w|| / (||g|| + wd * ||w||) when ||w|| > 0 and
    ||g|| > 0, and 1 otherwise (TF 1 contrib's and apex's convention).

    Args:
      learning_rate: a finite float > 0 or a float tensor (a towerlib.schedules
        rate: its .tensor(global_step)).
      momentum: in [0, 1).
      weight_decay: >= 0, added to the gradient of adapted variables.
      eta: the trust coefficient (0.001 in the paper).
      excluded: variable -> bool; True for plain momentum SGD without decay.
    """

    def __init__(self, learning_rate, momentum=0.9, weight_decay=0.0, eta=0.001,
                 excluded=None, use_locking=False, name="LARS"):
        super().__init__(learning_rate, weight_decay, excluded, use_locking, name)
        _check_finite(name, momentum=momentum, eta=eta)
        if not 0 <= momentum < 1 or not eta > 0:
            raise ValueError(f"LARS: momentum must be in [0, 1) and eta > 0, got "
                             f"{momentum!r} and {eta!r}.")
        self._momentum, self._eta = float(momentum), float(eta)

    def _create_slots(self, var_list):
        for variable in var_list:
            self._zeros_slot(variable, "momentum", self._name)

    def _apply_dense_update(self, grad, var):
        rate = self._rate_for(var)
        velocity = self.get_slot(var, "momentum")
        if self._adapted(var):
            w_norm, g_norm = tf.norm(var), tf.norm(grad)
            trust = self._trust(self._eta * w_norm, g_norm + self._weight_decay * w_norm,
                                (w_norm, g_norm))
            step = rate * trust * (grad + self._weight_decay * var)
        else:
            step = rate * grad
        new_velocity = velocity.assign(self._momentum * velocity + step,
                                       use_locking=self._use_locking)
        return var.assign_sub(new_velocity, use_locking=self._use_locking)


class LAMBOptimizer(_TrustRatioOptimizer):
    """LAMB (see the module docstring).

    Args:
      learning_rate: a finite float > 0 or a float tensor.
      beta1, beta2, epsilon: Adam's, for the moments.
      weight_decay: >= 0, decoupled (added to the Adam direction) for adapted variables.
      excluded: variable -> bool; True for Adam's direction without trust or decay.
    """

    def __init__(self, learning_rate, beta1=0.9, beta2=0.999, epsilon=1e-6, weight_decay=0.0,
                 excluded=None, use_locking=False, name="LAMB"):
        super().__init__(learning_rate, weight_decay, excluded, use_locking, name)
        _check_finite(name, beta1=beta1, beta2=beta2, epsilon=epsilon)
        # An epsilon that float32 rounds to 0 divides a zero gradient's 0 by 0.
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and epsilon >= _FLOAT32_TINY):
            raise ValueError(f"LAMB: beta1, beta2 must be in [0, 1) and epsilon >= "
                             f"{_FLOAT32_TINY:.3g} (a float32 above 0), got {beta1!r}, "
                             f"{beta2!r}, {epsilon!r}. Fix: e.g. epsilon=1e-6.")
        self._beta1, self._beta2, self._epsilon = float(beta1), float(beta2), float(epsilon)

    def _create_slots(self, var_list):
        first = min(var_list, key=lambda v: v.name)
        self._create_non_slot_variable(self._beta1, "beta1_power", first)
        self._create_non_slot_variable(self._beta2, "beta2_power", first)
        for variable in var_list:
            self._zeros_slot(variable, "m", self._name)
            self._zeros_slot(variable, "v", self._name)

    def _powers(self):
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        return (self._get_non_slot_variable("beta1_power", graph=graph),
                self._get_non_slot_variable("beta2_power", graph=graph))

    def _apply_dense_update(self, grad, var):
        dtype = var.dtype.base_dtype
        beta1_power, beta2_power = (tf.cast(p, dtype) for p in self._powers())
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_t = m.assign(self._beta1 * m + (1 - self._beta1) * grad, use_locking=self._use_locking)
        v_t = v.assign(self._beta2 * v + (1 - self._beta2) * tf.square(grad),
                       use_locking=self._use_locking)
        direction = (m_t / (1 - beta1_power)) / (
            tf.sqrt(v_t / (1 - beta2_power)) + self._epsilon)
        if self._adapted(var):
            direction = direction + self._weight_decay * var
            w_norm, r_norm = tf.norm(var), tf.norm(direction)
            direction = self._trust(w_norm, r_norm, (w_norm, r_norm)) * direction
        return var.assign_sub(self._rate_for(var) * direction, use_locking=self._use_locking)

    def _finish(self, update_ops, name_scope):
        with tf.control_dependencies(update_ops):
            beta1_power, beta2_power = self._powers()
            with tf.compat.v1.colocate_with(beta1_power):
                updates = [beta1_power.assign(beta1_power * self._beta1,
                                              use_locking=self._use_locking),
                           beta2_power.assign(beta2_power * self._beta2,
                                              use_locking=self._use_locking)]
        return tf.group(*update_ops + updates, name=name_scope)


_FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32


def _check_rate(rate, name):
    """A rate is a finite number > 0 or a tensor; a schedule object is named with its fix."""
    if hasattr(rate, "rate_at") and hasattr(rate, "tensor"):
        raise TypeError(f"{name}: learning_rate is the schedule {type(rate).__name__}, not a "
                        "rate. Fix: pass its tensor, learning_rate=rate.tensor(global_step).")
    if isinstance(rate, (str, bytes)):
        raise TypeError(f"{name}: learning_rate is the string {rate!r}. Fix: a number, "
                        f"e.g. {name}(0.1, ...) (a flag read as text: float(value)).")
    if isinstance(rate, bool) or (isinstance(rate, numbers.Real)
                                  and not 0 < rate < math.inf):
        raise ValueError(f"{name}: learning_rate must be a finite number > 0 or a float "
                         f"tensor, got {rate!r}. Fix: e.g. {name}(0.1, ...).")


# A usual value of each setting, for the fix a refusal names.
_EXAMPLE = {"weight_decay": 1e-4, "momentum": 0.9, "eta": 0.001, "beta1": 0.9,
            "beta2": 0.999, "epsilon": 1e-6}


def _check_finite(name, **values):
    """Each value a finite real number (not a bool, a string or None), else one line."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}: {key} must be a number, got {value!r} "
                            f"({type(value).__name__}). Fix: e.g. {key}={_EXAMPLE[key]}.")
        if not math.isfinite(value):
            raise ValueError(f"{name}: {key} must be a finite number, got {value!r}; "
                             "it makes every step NaN or zero.")
