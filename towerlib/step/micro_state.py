"""Values kept across the micro-batches of one step, in step-local variables.

The accumulation loop's body (towerlib.step.micro_loop) is built once; what
one iteration hands to the next (summed gradients, pooled batch-norm
moments, loss totals) is known only while it is built, so it cannot be the
loop's carried tensors, which are fixed before. It is kept in variables
instead, made here as the body asks for them:

- created outside the loop (tf.init_scope), in LOCAL_VARIABLES (never
  saved), on the device of the tower whose values they hold;
- packed: per device, every summed value of one dtype is one flat buffer
  (a model's gradients are one variable, not one per weight), and every
  pooled batch-norm moment one set of (counts, means, variances) vectors,
  pooled channel by channel with Chan's formula; only appended values
  (sparse gradients' rows) have a variable each. Packing is what keeps the
  build near k = 1's: a variable, an assign and a read per weight per tower
  cost about as much as the towers;
- micro-batch 0 assigns, later micro-batches combine, so the first read of
  a step is after its first write: nothing is zeroed and nothing of an
  earlier, interrupted step is read;
- all of one device's writes are one tf.cond on "is this micro-batch 0",
  whose branches hold that device's assigns: a write never moves a value
  to another device.

    state = StepState(is_first, devices)
    state.add(("loss", 0), weighted_loss, tower_index=0)
    writes = state.write()             # the loop's counter waits for these
    # after the loop, under its control dependency:
    total = state.read(("loss", 0))
"""

import collections
import dataclasses
from typing import Any, List

import tensorflow as tf

__all__ = ["StepState"]


@dataclasses.dataclass
class _Entry:
    key: Any
    kind: str            # 'sum', 'append', 'first' or 'pool'
    values: List[tf.Tensor]
    shapes: List[tf.TensorShape]


class StepState:
    """Step-local variables written once per micro-batch, read after the loop.

    Args:
      is_first: bool scalar of the body, whether this is micro-batch 0.
      devices: the towers' devices; a value of tower i lives on devices[i].
    """

    def __init__(self, is_first, devices):
        self._is_first = is_first
        self._devices = list(devices)
        self._entries = collections.OrderedDict()   # key -> (tower index, _Entry)
        self._reads = {}                            # key -> [tensor], after the loop
        self._variables = []
        self._readers = []                          # functions filling _reads

    def add(self, key, value, tower_index, static_shape=None):
        """Keeps sum_j value_j (a tensor of a shape known while building)."""
        shape = value.shape if value.shape.is_fully_defined() else tf.TensorShape(static_shape)
        if not shape.is_fully_defined():
            raise ValueError(f"StepState.add({key!r}): shape {shape} is not known.")
        self._keep(key, "sum", [value], [shape], tower_index)

    def append(self, key, value, tower_index):
        """Keeps every micro-batch's `value` concatenated along axis 0 (sparse rows)."""
        self._keep(key, "append", [value],
                   [tf.TensorShape([None]).concatenate(value.shape[1:])], tower_index)

    def keep_first(self, key, value, tower_index):
        """Keeps micro-batch 0's `value` (the same in every micro-batch)."""
        self._keep(key, "first", [value], [value.shape], tower_index)

    def pool(self, key, statistics, tower_index):
        """Keeps the pooled (count, mean [C], variance [C]) of a BatchNormStatistics."""
        values = [tf.reshape(tf.cast(statistics.count, tf.float32), [1]),
                  tf.cast(statistics.mean, tf.float32), tf.cast(statistics.variance, tf.float32)]
        shapes = [tf.TensorShape([1]), statistics.mean.shape, statistics.variance.shape]
        self._keep(key, "pool", values, shapes, tower_index)

    def write(self) -> List[tf.Tensor]:
        """One cond per device: assign at micro-batch 0, combine after. Returns their outputs."""
        written = []
        for tower_index in sorted({index for index, _ in self._entries.values()}):
            device = self._devices[tower_index]
            entries = [e for index, e in self._entries.values() if index == tower_index]
            with tf.device(device):
                stores = self._stores(entries, tower_index)

                def branch(first, stores=stores):
                    updates = []
                    for store in stores:
                        updates.extend(store(first))
                    with tf.control_dependencies(updates):
                        return tf.constant(True)

                written.append(tf.cond(self._is_first, lambda b=branch: b(True),
                                       lambda b=branch: b(False),
                                       name=f"keep_tower_{tower_index}"))
        return written

    def variables(self):
        """Every variable made, in order."""
        return tuple(self._variables)

    def read(self, key) -> tf.Tensor:
        """The kept value (call after the loop, under its control dependency)."""
        return self._read(key)[0]

    def read_pooled(self, key):
        """(count, mean, variance) kept by pool(); count a float32 scalar."""
        count, mean, variance = self._read(key)
        return tf.reshape(count, []), mean, variance

    # ----------------------------------------------------------------- internals

    def _keep(self, key, kind, values, shapes, tower_index):
        if key in self._entries:
            raise ValueError(f"StepState: {key!r} is kept twice.")
        self._entries[key] = (tower_index, _Entry(key, kind, values, shapes))

    def _variable(self, shape, dtype, tower_index, name):
        with tf.device(self._devices[tower_index]), tf.init_scope():
            known = shape.is_fully_defined()
            variable = tf.compat.v1.Variable(
                tf.zeros(shape.as_list() if known else [0] * max(shape.rank or 1, 1), dtype),
                trainable=False, name=name, use_resource=True,
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                validate_shape=known, shape=shape if known else tf.TensorShape(None))
        self._variables.append(variable)
        return variable

    def _stores(self, entries, tower_index):
        """Functions first -> assign ops, one per packed variable of this device."""
        stores = []
        by_dtype = collections.OrderedDict()
        for entry in entries:
            if entry.kind in ("sum", "first"):
                by_dtype.setdefault((entry.kind, entry.values[0].dtype), []).append(entry)
            elif entry.kind == "append":
                stores.append(self._append_store(entry, tower_index))
        for (kind, dtype), group in by_dtype.items():
            stores.append(self._flat_store(group, kind, dtype, tower_index))
        pooled = [e for e in entries if e.kind == "pool"]
        if pooled:
            stores.append(self._pool_store(pooled, tower_index))
        return stores

    def _flat_store(self, group, kind, dtype, tower_index):
        sizes = [int(e.shapes[0].num_elements()) for e in group]
        buffer = self._variable(tf.TensorShape([sum(sizes)]), dtype, tower_index,
                                f"kept_{kind}_{dtype.name}")

        # Packed before the cond, so that its branches capture one tensor, not one per weight.
        flat = tf.concat([tf.reshape(e.values[0], [-1]) for e in group], axis=0)

        def store(first):
            if first:
                return [buffer.assign(flat, read_value=False)]
            if kind == "first":
                return []
            return [buffer.assign_add(flat, read_value=False)]

        def reader():
            with tf.device(buffer.device):
                parts = tf.split(buffer.read_value(), sizes)
                for entry, part in zip(group, parts):
                    self._reads[entry.key] = [tf.reshape(part, entry.shapes[0])]

        self._readers.append(reader)
        return store

    def _append_store(self, entry, tower_index):
        variable = self._variable(entry.shapes[0], entry.values[0].dtype, tower_index,
                                  "kept_rows")

        def store(first):
            value = entry.values[0]
            if not first:
                value = tf.concat([variable.read_value(), value], axis=0)
            return [variable.assign(value, read_value=False)]

        def reader():
            with tf.device(variable.device):
                value = variable.read_value()
            value.set_shape(entry.shapes[0])
            self._reads[entry.key] = [value]

        self._readers.append(reader)
        return store

    def _pool_store(self, pooled, tower_index):
        """(counts [L], means [sum C], variances [sum C]) of L batch-norm records.

        Chan's formula channel by channel, each channel weighted by its
        layer's counts: the same arithmetic as
        towerlib.batchnorm.normalization.pooled_statistics on two shards.
        """
        channels = [int(e.shapes[1].num_elements()) for e in pooled]
        counts_var = self._variable(tf.TensorShape([len(pooled)]), tf.float32, tower_index,
                                    "kept_counts")
        means_var = self._variable(tf.TensorShape([sum(channels)]), tf.float32, tower_index,
                                   "kept_means")
        variances_var = self._variable(tf.TensorShape([sum(channels)]), tf.float32,
                                       tower_index, "kept_variances")

        packed = [tf.concat([e.values[part] for e in pooled], axis=0) for part in range(3)]

        def store(first):
            counts, means, variances = packed
            if not first:
                old_counts = counts_var.read_value()
                old_means, old_variances = means_var.read_value(), variances_var.read_value()
                total = old_counts + counts
                weights = tf.repeat(tf.stack([old_counts / total, counts / total], axis=1),
                                    channels, axis=0)  # [sum C, 2]: each layer's per channel
                old_weight, new_weight = weights[:, 0], weights[:, 1]
                mean = old_weight * old_means + new_weight * means
                variances = (old_weight * (old_variances + tf.square(old_means - mean))
                             + new_weight * (variances + tf.square(means - mean)))
                counts, means = total, mean
            return [counts_var.assign(counts, read_value=False),
                    means_var.assign(means, read_value=False),
                    variances_var.assign(variances, read_value=False)]

        def reader():
            with tf.device(counts_var.device):
                counts = tf.split(counts_var.read_value(), len(pooled))
                means = tf.split(means_var.read_value(), channels)
                variances = tf.split(variances_var.read_value(), channels)
            for entry, count, mean, variance in zip(pooled, counts, means, variances):
                self._reads[entry.key] = [count, tf.reshape(mean, entry.shapes[1]),
                                          tf.reshape(variance, entry.shapes[2])]

        self._readers.append(reader)
        return store

    def _read(self, key):
        if not self._reads:
            for reader in self._readers:
                reader()
        return self._reads[key]
