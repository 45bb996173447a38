"""Tolerances of the half-precision tests, from the precision and the computation.

A half dtype keeps p significant bits (the implicit one included): bfloat16 8,
float16 11. Rounding to nearest errs by at most the unit roundoff u = 2**-p of the
value: bfloat16 2**-8 = 3.9e-3, float16 2**-11 = 4.9e-4. Each tensor a tower
computes in that dtype is rounded once; a number that passes through R such
roundings carries at most about R u relative error. The tests bound their
differences by R u times the size of what they compare (a gradient, or how far
the weights moved), never by what one CPU's kernels happened to give: oneDNN's
kernels and TensorFlow's own order the same sums differently, and both must pass
(CI runs the tests marked half_precision under TF_ENABLE_ONEDNN_OPTS=0 and 1).
docs/precision.md, "Tolerances of the tests", has the derivation.
"""

import numpy as np

UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}

# Roundings on the path from a weight to its gradient in the small models of the tests
# (conv, batch norm, ReLU, pool, one or two dense layers, the loss): about 8 tensors
# forward and 8 back, each of which may round differently in the two computations
# compared. 16 u is still 1/16 (bfloat16) and 1/128 (float16) of the quantity: a half
# path that does not train, or trains on a wrong gradient, is far outside.
PATH_ROUNDINGS = 16


def unit_roundoff(dtype):
    return UNIT_ROUNDOFF[str(dtype)]


def ulp(value, dtype):
    """The spacing of `dtype` at |value|: 2u times the power of 2 at or below it."""
    return 2 * unit_roundoff(dtype) * 2.0 ** np.floor(np.log2(np.abs(value)))


def motion(after, before):
    """How far the training moved its state: max |after - before| over the names of `before`."""
    return max(float(np.max(np.abs(np.asarray(after[name]) - np.asarray(value))))
               for name, value in before.items() if name in after)


def trained_atol(dtype, moved, roundings=PATH_ROUNDINGS):
    """Weights trained in `dtype` against another computation of the same steps: each
    step's gradient within roundings * u of its size, so the weights within
    roundings * u * `moved` (their largest motion over the steps)."""
    return roundings * unit_roundoff(dtype) * moved
