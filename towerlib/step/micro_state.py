"""Values kept across the micro-batches of one step, in step-local buffers.

The accumulation loop's body (towerlib.step.micro_loop) is built once; what
one iteration hands to the next (summed gradients, pooled batch-norm
moments, loss totals) is known only while it is built, so it cannot be the
loop's carried tensors, which are fixed before. It is kept in resource
buffers instead, made here as the body asks for them:

- each on the device of the tower whose values it holds, made outside the
  loop (tf.init_scope) as a bare resource (tf.raw_ops.VarHandleOp): not a
  tf.Variable, so not in any collection, never saved, never initialized
  (a tf.Variable costs a few milliseconds to build, a handle next to nothing);
  the body names it by a handle op of its own rather than capturing it;
- set to zero before the loop, every step: the loop's counter reads a
  token that waits for the resets, so a step starts from zeros whatever an
  earlier step cut short left behind;
- a large gradient has a buffer of its own, added to in place (its memory:
  the buffer and the micro-batch's gradient); small values are packed per
  device into one vector (small gradients, the losses, tower scalars: fewer
  buffers, and the copy that packing costs is small), and every batch-norm
  moment into one set of (counts, means, variances) vectors, pooled channel
  by channel with Chan's formula. From zeros the first micro-batch's
  pooling is exact: weights 0 and n / n = 1.

    state = StepState(devices)
    state.add(("loss", 0), weighted_loss, tower_index=0)
    writes = state.write()   # in the body: the loop's counter waits for these
    # after the loop, under its control dependency:
    total = state.read(("loss", 0))
"""

import collections
import dataclasses
from typing import Any, List

import numpy as np
import tensorflow as tf

__all__ = ["StepState"]


@dataclasses.dataclass
class _Entry:
    key: Any
    kind: str            # 'own' (a buffer of its own), 'sum' (packed), 'append', 'last', 'pool'
    values: List[tf.Tensor]
    shapes: List[tf.TensorShape]


def _shaped(vector, shape):
    """A [n] vector reshaped to `shape`, with no op when that is a vector too (most are)."""
    shape = tf.TensorShape(shape)
    return vector if shape.rank == 1 else tf.reshape(vector, shape)


def _flat(tensor, vector_shape):
    """`tensor` as a vector (`vector_shape` the constant [-1]), no op when it is one."""
    return tensor if tensor.shape.rank == 1 else tf.reshape(tensor, vector_shape)


class _Buffer:
    """A resource holding one tensor, on one device, reset to `zeros` before each loop.

    The loop's body names the resource with a handle op of its own (the same
    shared name) instead of capturing the outer handle: a capture would cost
    the loop an input, an output and a placeholder in each of its functions,
    and every tf.gradients call in the body a longer capture list.
    """

    def __init__(self, shape, dtype, device, name, zeros):
        self.shape, self.dtype, self.device = tf.TensorShape(shape), tf.as_dtype(dtype), device
        with tf.device(device), tf.init_scope():
            self._shared_name = tf.compat.v1.get_default_graph().unique_name(
                f"accumulation/{name}")
            self.handle = tf.raw_ops.VarHandleOp(
                dtype=self.dtype, shape=self.shape, shared_name=self._shared_name,
                name=self._shared_name)
            self.reset = tf.raw_ops.AssignVariableOp(
                resource=self.handle, value=zeros.get(self.shape, self.dtype, device))
        self._body_handle = None

    def _handle_here(self):
        """The handle in the graph being built: the outer one, or the body's own.

        The body's names the same resource: the same shared name, container
        and device as the outer handle (no device function runs for it: one
        could place it elsewhere)."""
        graph = tf.compat.v1.get_default_graph()
        if graph is self.handle.graph:
            return self.handle
        if self._body_handle is None or self._body_handle.graph is not graph:
            with tf.compat.v1.device(None), tf.device(self.handle.device):
                self._body_handle = tf.raw_ops.VarHandleOp(
                    dtype=self.dtype, shape=self.shape, shared_name=self._shared_name,
                    container=self.handle.op.get_attr("container"),
                    name=self._shared_name.rsplit("/", 1)[-1])
        return self._body_handle

    def read(self):
        with tf.device(self.device):
            value = tf.raw_ops.ReadVariableOp(resource=self._handle_here(), dtype=self.dtype)
        value.set_shape(self.shape)
        return value

    def assign(self, value):
        return tf.raw_ops.AssignVariableOp(resource=self._handle_here(), value=value)

    def assign_add(self, value):
        return tf.raw_ops.AssignAddVariableOp(resource=self._handle_here(), value=value)


class _Zeros:
    """The buffers' reset values: one fill per device, shape and dtype (many
    kernels share a shape), from one scalar zero per dtype; built under init_scope."""

    def __init__(self):
        self._scalars, self._fills = {}, {}

    def get(self, shape, dtype, device):
        if dtype not in self._scalars:
            self._scalars[dtype] = tf.constant(0, dtype, name="zero")
        key = (device, tuple(shape.as_list()), dtype)
        if key not in self._fills:
            self._fills[key] = tf.fill([d if d is not None else 0 for d in shape.as_list()],
                                       self._scalars[dtype])
        return self._fills[key]


def _write(entry, buffer):
    """One micro-batch's write of an 'own', 'last' or 'append' entry."""
    value = entry.values[0]
    if entry.kind == "own":
        return buffer.assign_add(value)
    if entry.kind == "append":
        return buffer.assign(tf.concat([buffer.read(), value], axis=0))
    return buffer.assign(value)


class StepState:
    """Step-local buffers written once per micro-batch, read after the loop.

    Args:
      devices: the towers' devices; a value of tower i lives on devices[i].
    """

    def __init__(self, devices):
        self._devices = list(devices)
        self._entries = collections.OrderedDict()   # key -> (tower index, _Entry)
        self._buffers = []
        self._zeros = _Zeros()                      # the resets' values
        self._reads = {}                            # key -> [tensor], after the loop
        self._readers = []

    def add(self, key, value, tower_index, static_shape=None, own_buffer=False):
        """Keeps sum_j value_j (a shape known while building); `own_buffer` for large ones."""
        shape = value.shape if value.shape.is_fully_defined() else tf.TensorShape(static_shape)
        if not shape.is_fully_defined():
            raise ValueError(f"StepState.add({key!r}): shape {shape} is not known.")
        self._keep(key, "own" if own_buffer else "sum", [value], [shape], tower_index)

    def append(self, key, value, tower_index):
        """Keeps every micro-batch's `value` concatenated along axis 0 (sparse rows)."""
        self._keep(key, "append", [value],
                   [tf.TensorShape([None]).concatenate(value.shape[1:])], tower_index)

    def keep_last(self, key, value, tower_index):
        """Keeps `value` as the last micro-batch wrote it (one the same in every micro-batch)."""
        self._keep(key, "last", [value], [value.shape], tower_index)

    def pool(self, key, statistics, tower_index):
        """Keeps the pooled (count, mean [C], variance [C]) of a BatchNormStatistics."""
        count = tf.cast(statistics.count, tf.float32)
        if count.shape.rank is None:
            count = tf.reshape(count, [])
        elif count.shape.rank != 0:
            raise ValueError(f"StepState.pool({key!r}): the count must be a scalar, "
                             f"not of shape {count.shape}.")
        values = [count,
                  tf.cast(statistics.mean, tf.float32), tf.cast(statistics.variance, tf.float32)]
        shapes = [tf.TensorShape([]), statistics.mean.shape, statistics.variance.shape]
        self._keep(key, "pool", values, shapes, tower_index)

    def write(self) -> List[tf.Operation]:
        """The body's writes of every kept value, each after a read of the resets' token.

        The token is a tensor of the graph around the loop that waits for
        every buffer's reset; the body reads it (making it an input of the
        loop) and every write and read of a buffer waits for that read, so
        the resets run before the first micro-batch touches a buffer.
        """
        emitters = []
        for tower_index in sorted({index for index, _ in self._entries.values()}):
            entries = [e for index, e in self._entries.values() if index == tower_index]
            with tf.device(self._devices[tower_index]):
                emitters.extend(self._emitters(entries, tower_index))
        with tf.init_scope():
            with tf.control_dependencies([b.reset for b in self._buffers]):
                token = tf.constant(0, name="accumulation_buffers_reset")
        writes = []
        with tf.control_dependencies([tf.identity(token)]):
            for tower_index in sorted({index for index, _ in emitters}):
                # The scope makes a traced step count the writes as the tower's
                # aggregation (towerlib.trace.phases).
                with tf.device(self._devices[tower_index]), \
                        tf.name_scope(f"accumulate_tower_{tower_index}"):
                    for _, emit in [e for e in emitters if e[0] == tower_index]:
                        writes.extend(emit())
        return writes

    def buffers(self):
        """The resource handles of every buffer, in order."""
        return tuple(buffer.handle for buffer in self._buffers)

    def read(self, key) -> tf.Tensor:
        """The kept value (call after the loop, under its control dependency)."""
        return self._read(key)[0]

    def read_pooled(self, key):
        """(count, mean, variance) kept by pool(); count a float32 scalar."""
        return tuple(self._read(key))

    # ----------------------------------------------------------------- internals

    def _keep(self, key, kind, values, shapes, tower_index):
        if key in self._entries:
            raise ValueError(f"StepState: {key!r} is kept twice.")
        self._entries[key] = (tower_index, _Entry(key, kind, values, shapes))

    def _buffer(self, shape, dtype, tower_index, name):
        buffer = _Buffer(shape, dtype, self._devices[tower_index], name, self._zeros)
        self._buffers.append(buffer)
        return buffer

    def _emitters(self, entries, tower_index):
        """(tower, function making the writes) per buffer: buffers now, writes later."""
        emitters = []
        packed = collections.OrderedDict()
        for entry in entries:
            value, shape = entry.values[0], entry.shapes[0]
            if entry.kind in ("own", "last", "append"):
                buffer = self._buffer(shape, value.dtype, tower_index,
                                      "kept_rows" if entry.kind == "append" else "kept")
                emitters.append((tower_index, lambda e=entry, b=buffer: [_write(e, b)]))
                self._readers.append(lambda e=entry, b=buffer: self._reads.__setitem__(
                    e.key, [b.read()]))
            elif entry.kind == "sum":
                packed.setdefault(value.dtype, []).append(entry)
        for dtype, group in packed.items():
            emitters.append((tower_index, self._packed_sum(group, dtype, tower_index)))
        pooled = [e for e in entries if e.kind == "pool"]
        if pooled:
            emitters.append((tower_index, self._pooled(pooled, tower_index)))
        return emitters

    def _packed_sum(self, group, dtype, tower_index):
        sizes = [int(e.shapes[0].num_elements()) for e in group]
        buffer = self._buffer([sum(sizes)], dtype, tower_index, "kept_sums")

        def reader():
            parts = tf.split(buffer.read(), sizes)
            for entry, part in zip(group, parts):
                self._reads[entry.key] = [_shaped(part, entry.shapes[0])]

        self._readers.append(reader)

        def emit():
            vector_shape = (tf.constant([-1], name="vector_shape")
                            if any(e.values[0].shape.rank != 1 for e in group) else None)
            return [buffer.assign_add(
                tf.concat([_flat(e.values[0], vector_shape) for e in group], axis=0))]

        return emit

    def _pooled(self, pooled, tower_index):
        """(counts [L], means [sum C], variances [sum C]) of L batch-norm records.

        Chan's formula channel by channel, each channel weighted by its
        layer's counts: the arithmetic of
        towerlib.batchnorm.normalization.pooled_statistics on two shards.
        """
        channels = [int(e.shapes[1].num_elements()) for e in pooled]
        counts_buffer = self._buffer([len(pooled)], tf.float32, tower_index, "kept_counts")
        means_buffer = self._buffer([sum(channels)], tf.float32, tower_index, "kept_means")
        variances_buffer = self._buffer([sum(channels)], tf.float32, tower_index,
                                        "kept_variances")
        layer_ends = np.cumsum(channels).astype(np.int32)  # [L]; layer l ends at layer_ends[l]

        def emit():
            # Each channel's layer: how many layers end at or before it (a small
            # constant, where the index itself would put sum C ints in the GraphDef).
            layer_of_channel = tf.searchsorted(layer_ends, tf.range(int(layer_ends[-1])),
                                               side="right")
            counts = tf.stack([e.values[0] for e in pooled])
            means, variances = [tf.concat([e.values[part] for e in pooled], axis=0)
                                for part in (1, 2)]
            old_counts, old_means = counts_buffer.read(), means_buffer.read()
            old_variances = variances_buffer.read()
            total = old_counts + counts
            weights = tf.gather(tf.stack([old_counts / total, counts / total], axis=1),
                                layer_of_channel)  # [sum C, 2]: each layer's, per channel
            old_weight, new_weight = weights[:, 0], weights[:, 1]
            mean = old_weight * old_means + new_weight * means
            variance = (old_weight * (old_variances + tf.square(old_means - mean))
                        + new_weight * (variances + tf.square(means - mean)))
            return [counts_buffer.assign(total), means_buffer.assign(mean),
                    variances_buffer.assign(variance)]

        def reader():
            counts = tf.unstack(counts_buffer.read(), num=len(pooled))
            means = tf.split(means_buffer.read(), channels)
            variances = tf.split(variances_buffer.read(), channels)
            for entry, count, mean, variance in zip(pooled, counts, means, variances):
                self._reads[entry.key] = [count, _shaped(mean, entry.shapes[1]),
                                          _shaped(variance, entry.shapes[2])]

        self._readers.append(reader)
        return emit

    def _read(self, key):
        if not self._reads:
            for reader in self._readers:
                reader()
        return self._reads[key]
