"""Splitting one global batch into per-tower shards.

The global batch is the unit of one optimizer step. When its size B is not a
multiple of the tower count N, the first B % N towers get one example more,
so shards differ by at most one; the loss weighting in `train_graph` keeps the
objective the exact mean over all B examples.
"""

import numbers

import tensorflow as tf

from towerlib.checks import run_time

# The graph collection of the input initializers to run again once every variable
# holds its final value: after a restore, and after the chief's broadcast across
# workers (an input whose position is read from variables, towerlib.global_batch_input).
INPUT_INITIALIZERS = "towerlib_input_initializers"


def _batch_dims(flat_inputs):
    """Static leading dimensions (None when unknown) of every input tensor."""
    dims = []
    for tensor in flat_inputs:
        if tensor.shape.rank == 0:
            raise ValueError(
                f"Input tensor {tensor.name} is a scalar; every input must have "
                "a leading batch dimension to split across towers.")
        dims.append(tf.compat.dimension_value(tensor.shape[0])
                    if tensor.shape.rank is not None else None)
    return dims


def refuse_sparse(item):
    """A SparseTensor or RaggedTensor input, refused in one line (towers take dense tensors)."""
    if isinstance(item, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(
            f"An input is a {type(item).__name__}; towerlib's towers take dense tensors "
            "only (a global batch and an input function's batch alike). Fix: make it "
            "dense in the input pipeline (tf.sparse.to_dense, or ragged.to_tensor() padded "
            "to a fixed length, with a mask if the model needs one).")


def check_global_batch(inputs, num_towers):
    """Validates a global batch before the towers are built.

    Returns the static global batch size, or None when it is only known at
    run time (then `shard_sizes` adds run-time checks).
    """
    if isinstance(num_towers, bool) or not isinstance(num_towers, numbers.Integral) \
            or num_towers < 1:
        raise ValueError(f"num_towers={num_towers!r}: give the number of towers, an int "
                         ">= 1.")
    flat = tf.nest.flatten(inputs)
    if not flat:
        raise ValueError("inputs is empty: pass the global batch as a tensor or a "
                         "nest (tuple/dict) of tensors, or an input function.")
    for item in flat:
        refuse_sparse(item)
        if not isinstance(item, (tf.Tensor, tf.Variable)):
            raise TypeError(
                f"Every input must be a tf.Tensor, got {type(item).__name__}. "
                "Convert arrays with tf.constant, or pass an input function "
                "input_fn(ctx) that returns each tower's own batch.")
    dims = _batch_dims(flat)
    known = {d for d in dims if d is not None}
    if len(known) > 1:
        described = ", ".join(f"{t.name}: {d}" for t, d in zip(flat, dims))
        raise ValueError(
            "Input tensors disagree on the batch (first) dimension: "
            f"{described}. All inputs of one global batch must have the same "
            "number of examples.")
    batch = known.pop() if known else None
    if batch is not None and batch < num_towers:
        raise ValueError(
            f"The global batch has {batch} examples but there are {num_towers} "
            "towers, so some tower would get none. Use a global batch of at "
            f"least {num_towers} examples or fewer towers.")
    return batch


def _with_batch_check(tensor, batch):
    """`tensor`, checked at run time to have `batch` examples if its shape does not say."""
    if tensor.shape.rank is not None and tensor.shape[0] is not None:
        return tensor
    check = tf.debugging.assert_equal(
        tf.shape(tensor)[0], batch,
        message=run_time.message(
            f"Input {tensor.name} has a different batch dimension from the other "
            f"inputs ({batch}); every input of one global batch needs the same number "
            "of examples"))
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def shard_sizes(global_batch, num_towers):
    """Per-tower example counts: a list of ints, or an int32 [N] tensor.

    Args:
      global_batch: an int (static size) or an int32 scalar tensor.
      num_towers: N.
    """
    if isinstance(global_batch, int):
        base, extra = divmod(global_batch, num_towers)
        return [base + (1 if i < extra else 0) for i in range(num_towers)]
    base = global_batch // num_towers
    extra = global_batch % num_towers
    return base + tf.cast(tf.range(num_towers) < extra, tf.int32)


def split_global_batch(inputs, num_towers, host_device=""):
    """Splits every tensor of `inputs` along axis 0 into `num_towers` shards.

    Args:
      inputs: a nest of tensors sharing the leading dimension B.
      num_towers: N.
      host_device: where to split an input that has no device of its own
        (the towers' host CPU: on a GPU machine the placer would otherwise
        put the split, and so the whole global batch, on GPU 0).

    Returns:
      (shards, sizes): `shards[i]` is a nest shaped like `inputs` holding
      tower i's examples; `sizes[i]` is tower i's example count as an int32
      scalar tensor. Splitting runs on each input's own device.
    """
    static_batch = check_global_batch(inputs, num_towers)
    flat = tf.nest.flatten(inputs)
    with tf.name_scope("split_global_batch"):
        if static_batch is not None:
            sizes = shard_sizes(static_batch, num_towers)
            # Inputs whose batch dimension is only known at run time must match.
            flat = [_with_batch_check(t, static_batch) for t in flat]
        else:
            dynamic_batches = [tf.shape(t)[0] for t in flat]
            global_batch = dynamic_batches[0]
            checks = [
                tf.debugging.assert_equal(
                    batch, global_batch,
                    message=run_time.message(
                        f"Input {t.name} has a different batch dimension from the "
                        "first input; every input of one global batch needs the same "
                        "number of examples"))
                for t, batch in zip(flat[1:], dynamic_batches[1:])]
            checks.append(tf.debugging.assert_greater_equal(
                global_batch, num_towers,
                message=run_time.message(
                    f"The global batch is smaller than the tower count ({num_towers}); "
                    "some tower would get no examples")))
            with tf.control_dependencies(checks):
                sizes = shard_sizes(tf.identity(global_batch), num_towers)
        flat_shards = []
        for tensor in flat:
            with tf.device(tensor.device or host_device):
                flat_shards.append(
                    tf.split(tensor, sizes, num=num_towers, axis=0))
        sizes = [tf.constant(s, tf.int32) if isinstance(s, int) else s
                 for s in (sizes if isinstance(sizes, list)
                           else tf.unstack(sizes, num=num_towers))]
    shards = [tf.nest.pack_sequence_as(inputs, [pieces[i] for pieces in flat_shards])
              for i in range(num_towers)]
    return shards, sizes


def leading_batch_size(tower_inputs):
    """int32 scalar: the examples in one tower's batch (its first input's dim 0)."""
    flat = tf.nest.flatten(tower_inputs)
    if not flat:
        raise ValueError("The input function returned an empty batch.")
    for item in flat:
        refuse_sparse(item)
    first = tf.convert_to_tensor(flat[0])
    if first.shape.rank is not None and first.shape.rank >= 1 and first.shape[0] is not None:
        return tf.constant(first.shape[0], tf.int32)
    return tf.shape(first, out_type=tf.int32)[0]


def check_same_structure(tower_inputs, tower_index, earlier_towers):
    """Refuses a tower whose input differs from tower 0's in structure or dtypes.

    An input function must give every tower the same kind of batch (only the
    number of examples may differ); otherwise the tower function fails
    inside the user's model, far from the cause.
    """
    if not earlier_towers:
        return
    first = earlier_towers[0].inputs

    def described(nest):
        return tf.nest.map_structure(
            lambda t: getattr(getattr(t, "dtype", None), "name", type(t).__name__), nest)

    try:
        tf.nest.assert_same_structure(first, tower_inputs)
        same = described(first) == described(tower_inputs)
    except (ValueError, TypeError):
        same = False
    if not same:
        raise ValueError(
            f"The input function gave tower {tower_index} {described(tower_inputs)} but "
            f"tower 0 {described(first)}. Fix: return the same structure and dtypes for "
            "every tower (only the number of examples may differ).")
