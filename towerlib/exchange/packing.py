"""Packing same-dtype tensors into one flat vector for a single exchange.

One exchange per call is what keeps a batch-norm layer's cost to one round
trip whatever number of statistics it sends.
"""

import tensorflow as tf

__all__ = ["pack", "scope_name"]


def pack(flat):
    """One flat vector from same-dtype tensors, and the function undoing it.

    Returns (packed, unpack): packed is the tensors flattened and concatenated
    ([K]); unpack(result, leading) splits a [*leading, K] result back into
    tensors of shape [*leading, *shape_i]. For example two tensors of shapes
    [2, 3] and [4] pack into [10]; a gather over 8 towers returns [8, 10],
    which unpack(result, leading=[8]) splits into [8, 2, 3] and [8, 4].
    Static shapes give static splits and reshapes (no shape ops in the step);
    unknown ones fall back to tf.shape / tf.size at run time.
    """
    if all(t.shape.is_fully_defined() for t in flat):
        shapes = [t.shape.as_list() for t in flat]
        sizes = [t.shape.num_elements() for t in flat]
    else:
        shapes = [tf.shape(t) for t in flat]
        sizes = [tf.size(t) for t in flat]
    packed = _flatten(flat)

    def unpack(result, leading):
        axis = len(leading)
        pieces = [result] if len(flat) == 1 else tf.split(result, sizes, axis=axis, num=len(flat))
        unpacked = []
        for piece, shape, tensor in zip(pieces, shapes, flat):
            if isinstance(shape, list):
                target = leading + shape
            else:
                target = tf.concat([tf.constant(leading, tf.int32), shape], axis=0)
            if tensor.shape.rank != 1 or not isinstance(shape, list):
                piece = tf.reshape(piece, target)
            piece.set_shape(leading + tensor.shape.as_list())
            unpacked.append(piece)
        return unpacked

    return packed, unpack


def _flatten(flat):
    """The tensors as one vector: rank-1 ones as they are, the others reshaped.

    One shape constant serves every reshape and a single tensor needs no
    concat: an all-reduce packs a hundred gradients per tower this way.
    """
    flat_shape = None
    vectors = []
    for t in flat:
        if t.shape.rank != 1:
            if flat_shape is None:
                flat_shape = tf.constant([-1], tf.int32, name="flat_shape")
            t = tf.reshape(t, flat_shape)
        vectors.append(t)
    return vectors[0] if len(vectors) == 1 else tf.concat(vectors, axis=0)


def scope_name(name: str) -> str:
    """A name usable as a name scope (no '/' nesting, no ':')."""
    return name.replace("/", "_").replace(":", "_")
