"""Per-tower versus global batch: naming both numbers when a model confuses them.

towerlib's `inputs` is the global batch of B examples; tower i sees only its
n_i (B / N when divisible). TF 1 multi-GPU code was written the other way
round: the tutorial's `--batch_size` is per GPU and its model hard-codes it,
e.g. `tf.reshape(pool2, [batch_size_flag, -1])`. Fed a global batch of 128
over 4 towers, that reshape quietly turns a [32, 2304] tower batch into
[128, 576] and the build fails later, at the loss, with TensorFlow's
"labels.shape=(32,) and logits.shape=(128, 10)", nothing pointing at the
batch.

Two checks, both at build time and only when the sizes are known statically:

- `explain_shape_error`: a shape ValueError raised inside the tower function
  whose message holds the global batch B (and B != n_i) is re-raised as a
  BatchSizeMismatchError naming n_i, B and N, and any reshape of the tower
  to B in dimension 0.
- `check_reshapes`: a tower that built without error but reshapes a tensor
  of n_i rows into B rows is refused the same way.
"""

import re
from typing import List, Optional, Sequence

import tensorflow as tf

from towerlib.internals import error_texts


class BatchSizeMismatchError(ValueError):
    """A tower uses the global batch size where its own batch size belongs."""


def static_int(value) -> Optional[int]:
    """`value` (an int or a scalar tensor) as a Python int, or None if not static."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    known = tf.get_static_value(value)
    return None if known is None else int(known)


def _dim0(tensor) -> Optional[int]:
    shape = tensor.shape
    if shape.rank is None or shape.rank == 0:
        return None
    return shape[0]


def reshapes_to_global_batch(ops: Sequence[tf.Operation], tower_batch: int,
                             global_batch: int) -> List[tf.Operation]:
    """The Reshape ops among `ops` turning `tower_batch` rows into `global_batch`.

    Only a reshape whose target shape literally starts with `global_batch`
    counts (a hard-coded number): folding time steps into the batch,
    `tf.reshape(x, [-1, features])`, may also give B rows and is legitimate.
    """
    return [op for op in ops
            if op.type == "Reshape"
            and _dim0(op.inputs[0]) == tower_batch
            and _dim0(op.outputs[0]) == global_batch
            and _first_static_entry(op.inputs[1]) == global_batch]


def _first_static_entry(shape_tensor) -> Optional[int]:
    value = tf.get_static_value(shape_tensor)
    if value is None or getattr(value, "ndim", 0) != 1 or len(value) == 0:
        return None
    return int(value[0])


def _explanation(tower_index, tower_batch, global_batch, num_towers, what):
    return (
        f"Tower {tower_index} got {tower_batch} examples (its share of the global "
        f"batch of {global_batch} over {num_towers} towers), but {what}: the "
        f"global batch size {global_batch} is used where the tower's "
        f"{tower_batch} belongs. towerlib's `inputs` is the global batch and each "
        "tower sees only its share; the TF 1 tutorial's --batch_size is per GPU. "
        "Do not hard-code a batch size in the model: write tf.reshape(x, [-1, "
        "features]) or tf.reshape(x, [tf.shape(x)[0], -1]) (ctx.batch_size is "
        f"the tower's count), or, if {global_batch} was meant per tower, feed a "
        f"global batch of {num_towers} x {global_batch} = "
        f"{num_towers * global_batch}.")


def _describe_reshapes(reshapes):
    return "; ".join(f"{op.name} reshapes {op.inputs[0].shape} into {op.outputs[0].shape}"
                     for op in reshapes)


def explain_shape_error(error: Exception, ctx, tower_ops: Sequence[tf.Operation],
                        tower_batch: Optional[int],
                        global_batch: Optional[int]) -> Optional[BatchSizeMismatchError]:
    """A BatchSizeMismatchError explaining `error`, or None when it is not about the batch.

    Args:
      error: a ValueError the tower function raised while being built.
      ctx: the tower's TowerContext.
      tower_ops: the ops the tower function created (searched for reshapes).
      tower_batch / global_batch: n_i and B as ints, or None when not static.
    """
    if tower_batch is None or global_batch is None or tower_batch == global_batch:
        return None
    if not error_texts.is_shape_mismatch(error):
        return None
    if str(global_batch) not in re.findall(r"\d+", str(error)):
        return None
    reshapes = reshapes_to_global_batch(tower_ops, tower_batch, global_batch)
    what = "TensorFlow reports: " + str(error).splitlines()[0]
    if reshapes:
        what = f"{_describe_reshapes(reshapes)}, and then {what}"
    return BatchSizeMismatchError(_explanation(
        ctx.index, tower_batch, global_batch, ctx.num_towers, what))


def check_reshapes(ctx, tower_ops: Sequence[tf.Operation], tower_batch: Optional[int],
                   global_batch: Optional[int]) -> None:
    """Raises BatchSizeMismatchError if one of `tower_ops` reshapes n_i rows into B rows."""
    if tower_batch is None or global_batch is None or tower_batch == global_batch:
        return
    reshapes = reshapes_to_global_batch(tower_ops, tower_batch, global_batch)
    if reshapes:
        raise BatchSizeMismatchError(_explanation(
            ctx.index, tower_batch, global_batch, ctx.num_towers,
            _describe_reshapes(reshapes)))
