"""tf.distribute.MirroredStrategy with a tf.function training step: the modern alternative.

TF 2 style throughout: eager variables mirrored on every device, a
`tf.function` step that takes the next batch from a distributed iterator, runs
the replica step with `strategy.run`, and lets the optimizer all-reduce the
gradients and update every mirror. Nothing here is tuned down; it is given
what a careful TF 2 user would give it:

- the step is one `tf.function`, traced once (the iterator is an argument;
  the trace count is checked and reported);
- each replica reads its own shard of the global batch from a dataset placed
  on its device (`distribute_datasets_from_function`), or the global batch is
  split by `experimental_distribute_dataset`;
- the strategy's default cross-device all-reduce;
- batch-norm moving statistics are ON_READ variables aggregated by MEAN (as
  Keras does): each replica updates its own copy, with no communication.

The architecture is the very same tower function as every other
configuration: it runs inside the replica step under a custom variable getter
that hands `get_variable` the strategy's variables by name, so the model code
is shared and the weights are loaded by name from the same file.

TensorFlow's logical CPU devices can only be configured before the runtime
starts, so this runs in its own process (see `bench.worker`), which calls
`configure_devices` first.
"""

import time

import numpy as np
import tensorflow as tf

import towerlib
from bench import inputs as inputs_lib
from bench import weights as weights_lib
from bench.models import tower_loss

PER_REPLICA_INPUT = "per_replica"
DISTRIBUTE_DATASET_INPUT = "distribute_dataset"
INPUT_MODES = (PER_REPLICA_INPUT, DISTRIBUTE_DATASET_INPUT)


def configure_devices(num_devices, device_type):
    """The strategy's device strings; on CPU, first splits the CPU into logical devices.

    Must run before TensorFlow initializes its devices (before any op).
    """
    if device_type == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if num_devices > len(gpus):
            raise ValueError(f"{num_devices} GPU replicas asked for, {len(gpus)} GPU(s) present.")
        return [f"/device:GPU:{i}" for i in range(num_devices)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])
    return [f"/device:CPU:{i}" for i in range(num_devices)]


class MirroredTrainer:
    """A MirroredStrategy training step over `devices`, from the shared initial weights."""

    def __init__(self, model, settings, devices, initial_values, trainable_names):
        if settings.global_batch % len(devices):
            raise ValueError(
                f"The global batch {settings.global_batch} does not split evenly over "
                f"{len(devices)} replicas.")
        if settings.mirrored_input not in INPUT_MODES:
            raise ValueError(f"Unknown mirrored_input {settings.mirrored_input!r}; "
                             f"one of {INPUT_MODES}.")
        start = time.perf_counter()
        self.strategy = tf.distribute.MirroredStrategy(devices)
        self.num_replicas = self.strategy.num_replicas_in_sync
        self._model = model
        trainable = set(trainable_names)
        with self.strategy.scope():
            self.variables = {
                name: self._make_variable(name, value, name in trainable)
                for name, value in sorted(initial_values.items())}
            self._optimizer = tf.compat.v1.train.MomentumOptimizer(
                settings.learning_rate, settings.momentum)
        self._trainable = [self.variables[name] for name in sorted(trainable)]
        self._iterator = iter(self._distributed_dataset(settings))
        self._step = tf.function(self._train_step)
        self.initial_checksum = weights_lib.checksum(self.weights())
        # Tracing happens at the first call, the first warm-up step; count it there.
        self.build_seconds = [time.perf_counter() - start]

    @staticmethod
    def _make_variable(name, value, trainable):
        if trainable:
            return tf.Variable(value, name=name, trainable=True)
        # Moving statistics: one copy per replica, averaged when read (Keras's choice).
        return tf.Variable(value, name=name, trainable=False,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.MEAN)

    def _distributed_dataset(self, settings):
        """The fixed global batch, delivered to the replicas (replica i gets slice i)."""
        if settings.mirrored_input == DISTRIBUTE_DATASET_INPUT:
            return self.strategy.experimental_distribute_dataset(
                inputs_lib.synthetic_dataset(settings.global_batch, settings.seed))
        images, labels = inputs_lib.synthetic_batch(settings.global_batch, settings.seed)
        num_replicas = self.num_replicas
        per_replica = settings.global_batch // num_replicas
        # One element per replica batch; on one machine the strategy hands
        # consecutive elements to replicas 0, 1, ..., N-1, so one pass over the
        # N slices is one global batch, already split.
        slices = (images.reshape((num_replicas, per_replica) + images.shape[1:]),
                  labels.reshape((num_replicas, per_replica)))

        def dataset_fn(input_context):
            del input_context  # one input pipeline: this machine's
            return tf.data.Dataset.from_tensor_slices(slices).repeat()

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _replica_step(self, batch):
        """One replica: its loss share, gradients, and the optimizer's cross-replica apply."""
        regularization = []

        def strategy_variables(getter, name, *args, **kwargs):
            del getter, args
            variable = self.variables[name]
            regularizer = kwargs.get("regularizer")
            if regularizer is not None:
                regularization.append(regularizer(variable))
            return variable

        with tf.GradientTape() as tape:
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                             custom_getter=strategy_variables):
                loss = tower_loss(self._model.tower_fn(
                    batch, towerlib.TowerContext.single(is_training=True)))
            # The optimizer sums the replicas' gradients: each replica contributes
            # its share of the global-batch mean and 1/N of the regularization.
            objective = loss / self.num_replicas
            if regularization:
                objective += tf.add_n(regularization) / self.num_replicas
        gradients = tape.gradient(objective, self._trainable)
        self._optimizer.apply_gradients(zip(gradients, self._trainable))

    def _train_step(self, iterator):
        self.strategy.run(self._replica_step, args=(next(iterator),))

    def run_steps(self, num_steps):
        """Runs `num_steps` training steps; returns the wall time they took."""
        step = self._step
        iterator = self._iterator
        start = time.perf_counter()
        for _ in range(num_steps):
            step(iterator)
        return time.perf_counter() - start

    def trace_count(self):
        return self._step.experimental_get_tracing_count()

    def weights(self):
        """{name: value}; ON_READ statistics read as their mean over replicas."""
        return {name: np.asarray(variable.numpy()) for name, variable in self.variables.items()}

    def close(self):
        pass
