"""Graph-mode trainers: towerlib, the hand-written loop and one device, behind one interface.

Each builder makes a fresh `tf.Graph` holding the input, the model and one
train op, opens a Session with the devices it needs and loads the shared
initial weights. A `GraphTrainer` then runs steps: one `session.run(train_op)`
per global batch, nothing else fetched, which is how a training loop spends
its time between logging steps.
"""

import time

import tensorflow as tf

import towerlib
from bench import handwritten
from bench import inputs as inputs_lib
from bench import weights as weights_lib
from bench.configs import CIFAR_FILES_INPUT, HANDWRITTEN, SINGLE_DEVICE, TOWERLIB
from bench.models import tower_loss


class GraphTrainer:
    """A built training graph and its Session, ready to step."""

    def __init__(self, graph, session, train_op, initial_checksum, build_seconds):
        self.graph = graph
        self.session = session
        self.train_op = train_op
        self.initial_checksum = initial_checksum
        self.build_seconds = build_seconds

    def run_steps(self, num_steps):
        """Runs `num_steps` training steps; returns the wall time they took."""
        run = self.session.run
        train_op = self.train_op
        start = time.perf_counter()
        for _ in range(num_steps):
            run(train_op)
        return time.perf_counter() - start

    def weights(self):
        """{name: value} of the model variables now."""
        with self.graph.as_default():
            return weights_lib.session_values(
                self.session, tf.compat.v1.global_variables())

    def close(self):
        self.session.close()


def tower_devices(device_type, count):
    return [f"/device:{device_type.upper()}:{i}" for i in range(count)]


def _optimizer(settings):
    return tf.compat.v1.train.MomentumOptimizer(settings.learning_rate, settings.momentum)


def _dataset(config, model, settings):
    if config.input_source == CIFAR_FILES_INPUT:
        return inputs_lib.cifar_dataset(settings.data_dir, settings.global_batch,
                                        model.augmentation, settings.seed)
    return inputs_lib.synthetic_dataset(settings.global_batch, settings.seed)


def _build_towerlib(config, model, settings, devices):
    batch = inputs_lib.graph_input(_dataset(config, model, settings))
    train = towerlib.build_train_graph(
        model.tower_fn, batch, _optimizer(settings), devices=devices,
        bn_mode=config.bn_mode)
    return train.train_op, towerlib.session_config(len(devices))


def _build_handwritten(config, model, settings, devices):
    batch = inputs_lib.graph_input(_dataset(config, model, settings))
    train_op = handwritten.build_train_op(model.tower_fn, batch, _optimizer(settings),
                                          devices)
    return train_op, handwritten.session_config(len(devices))


def _build_single_device(config, model, settings, devices):
    """Plain TF 1 training on one device: the whole global batch, `minimize`."""
    batch = inputs_lib.graph_input(_dataset(config, model, settings))
    with tf.device(devices[0]):
        ctx = towerlib.TowerContext.single(is_training=True)
        loss = tower_loss(model.tower_fn(batch, ctx))
        regularization = tf.compat.v1.losses.get_regularization_losses()
        if regularization:
            loss += tf.add_n(regularization)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.control_dependencies(
                tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = _optimizer(settings).minimize(loss, global_step=global_step)
    return train_op, tf.compat.v1.ConfigProto(allow_soft_placement=True)


_BUILDERS = {
    TOWERLIB: _build_towerlib,
    HANDWRITTEN: _build_handwritten,
    SINGLE_DEVICE: _build_single_device,
}


def build(config, model, settings, initial_values):
    """Builds `config`'s training graph (timed; see `BenchConfig.times_construction`), opens it.

    Returns:
      A GraphTrainer whose build_seconds lists the time of each build: from an
      empty graph to the train op, input pipeline included, Session excluded.
    """
    devices = tower_devices(settings.device_type, config.devices_used)
    builder = _BUILDERS[config.kind]
    build_seconds = []
    repeats = settings.build_repeats if config.times_construction else 1
    for _ in range(max(1, repeats)):
        graph = tf.Graph()
        with graph.as_default():
            start = time.perf_counter()
            train_op, session_config = builder(config, model, settings, devices)
            build_seconds.append(time.perf_counter() - start)
            initializer = tf.compat.v1.global_variables_initializer()
            variables = tf.compat.v1.global_variables()
    session = tf.compat.v1.Session(graph=graph, config=session_config)
    with graph.as_default():
        session.run(initializer)
        checksum = weights_lib.load_into_session(session, variables, initial_values)
    graph.finalize()
    return GraphTrainer(graph, session, train_op, checksum, build_seconds)
