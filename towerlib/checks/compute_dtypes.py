"""The towers compute in the build's precision, or the build says where they do not.

A half-precision build casts the inputs and get_variable's weights to the
compute dtype. A model that reads its own float32 weights (a tf_keras model
constructed under the 'float32' policy, called from your own tower
function) would still run every matmul and convolution in float32, and a
Keras mixed policy under precision float32 would run them in half precision:
either way the run is not the precision asked for. Read from the tower's
forward ops (their dtype attribute `T`) right after tower 0 is built:

- half asked, none in it (the precision would change nothing): refused;
- float32 asked and some in half precision (a Keras mixed policy, or casts
  of your own), or half asked and some kept in float32 (a final layer kept
  in float32, as Keras recommends): one warning line naming how many, the
  first and the fix. (KerasTower refuses a Keras policy that disagrees.)
"""

import logging

import tensorflow as tf

__all__ = ["HEAVY_OP_TYPES", "check_compute_dtype"]

logger = logging.getLogger("towerlib")

# The ops that carry a model's arithmetic; element-wise ops follow their inputs.
HEAVY_OP_TYPES = frozenset({
    "MatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D",
    "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv3DBackpropInputV2", "Einsum"})

_PRECISION = {"float32": "Float32", "bfloat16": "BFloat16", "float16": "Float16"}
_POLICY = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def _heavy_by_dtype(ops):
    found = {}
    for op in ops:
        if op.type in HEAVY_OP_TYPES and "T" in op.node_def.attr:
            found.setdefault(tf.as_dtype(op.get_attr("T")).name, []).append(op.name)
    return found


def check_compute_dtype(ops, compute_dtype, tower_scope):
    """Raises ValueError, or warns, as the module says, for tower 0's forward `ops`."""
    compute = tf.as_dtype(compute_dtype).name
    found = _heavy_by_dtype(op for op in ops if op.name.startswith(tower_scope))
    half = sorted(d for d in found if d in _POLICY)
    if compute == "float32":
        if half:
            logger.warning(
                "Tower 0 computes %d matmuls or convolutions in %s (first: %s) although the "
                "build's precision is float32: a Keras mixed-precision policy, or casts of "
                "your own. If that is meant, say it: precision=towerlib.%s().",
                len(found[half[0]]), half[0], found[half[0]][0], _PRECISION[half[0]])
        return
    wanted, in_float32 = found.get(compute, []), found.get("float32", [])
    if in_float32 and not wanted:
        raise ValueError(
            f"precision={_PRECISION[compute]}() but tower 0 computes every matmul and "
            f"convolution in float32 (first: {in_float32[0]}): a model that reads its own "
            "float32 weights, such as a tf_keras model constructed under the 'float32' "
            "policy. Fix: call it through towerlib.KerasTower(make_model, loss) (or "
            "KerasTower(make_model, None).outputs(features, ctx) in your tower function), "
            "which builds it under Keras' policy "
            f"{_POLICY[compute]!r}, or construct it after tf_keras.mixed_precision."
            f"set_global_policy({_POLICY[compute]!r}).")
    if in_float32:
        logger.warning(
            "Tower 0 computes %d of %d matmuls and convolutions in float32 (first: %s) "
            "although precision=%s(): a layer kept in float32 (fine for a final layer).",
            len(in_float32), len(in_float32) + len(wanted), in_float32[0],
            _PRECISION[compute])
