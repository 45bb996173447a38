"""bench/traffic_count.py counts the bytes a step moves between devices: checked by hand.

The graph: 2 (or 4) towers on GPU device strings (built, never run, so no GPU
is needed), one dense layer 5 -> 3 (weights 15 floats = 60 bytes, biases 3
floats = 12 bytes), plain SGD, a global batch of 8 examples, x [8, 5] and
y [8, 3] float32, made on the host CPU. Each tower's shard is x [4, 5] (80
bytes) and y [4, 3] (48 bytes).

Besides these, a step sends a few 4-byte scalars across devices (each
tower's share n_i / B, the learning rate), made on whichever device the
placer picks; the tests pin every transfer larger than 8 bytes exactly and
only bound the scalars.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from bench import traffic_count, traffic_placement, traffic_rows
from towerlib import layers

CPU = "/device:CPU:0"
GPU0, GPU1 = "/device:GPU:0", "/device:GPU:1"
WEIGHTS, BIASES = 60, 12  # bytes of the dense layer's variables
X_SHARD, Y_SHARD = 80, 48  # bytes of one tower's shard of the batch (2 towers)
SCALAR_BYTES = 8  # transfers this small are scalars, only bounded


def _dense_tower(inputs, ctx):
    x, y = inputs
    return tf.reduce_mean(tf.square(layers.dense(x, 3, name="fc") - y))


def _count(num_towers, **options):
    """The traffic of one step of the tiny graph on `num_towers` GPU strings."""
    with tf.Graph().as_default():
        with tf.device(CPU):
            x = tf.constant(np.zeros((8, 5), np.float32))
            y = tf.constant(np.zeros((8, 3), np.float32))
        train = towerlib.build_train_graph(
            _dense_tower, (x, y), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=[f"/device:GPU:{i}" for i in range(num_towers)], summaries=False,
            **options)
        return (traffic_count.count_traffic(train.train_op),
                traffic_count.device_traffic(train.train_op))


def _large_edges(counted):
    """Sorted (source, destination, bytes, kind) of the transfers above scalar size."""
    return sorted((e.source, e.destination, e.num_bytes, e.kind)
                  for e in counted.edges if e.num_bytes > SCALAR_BYTES)


def _check_scalars_small(counted, per_device, expected_large):
    """The per-device totals are the large transfers plus at most a few scalars."""
    large = collections.defaultdict(lambda: [0, 0])
    for source, destination, num_bytes, _ in expected_large:
        large[source][0] += num_bytes
        large[destination][1] += num_bytes
    for part in counted.collectives:
        large[part.device][0] += part.sent_bytes
        large[part.device][1] += part.received_bytes
    for device, (sent, received) in per_device.items():
        assert 0 <= sent - large[device][0] <= 4 * SCALAR_BYTES, (device, sent)
        assert 0 <= received - large[device][1] <= 4 * SCALAR_BYTES, (device, received)
    assert not counted.unsized


def test_ring_formulas():
    # All-reduce of S among T: 2 (T - 1) / T x S each way per device.
    assert traffic_count.ring_all_reduce_bytes(100, 2) == 100
    assert traffic_count.ring_all_reduce_bytes(100, 4) == 150
    assert traffic_count.ring_all_reduce_bytes(100, 8) == 175
    # All-gather of S per device: (T - 1) x S each way per device.
    assert traffic_count.ring_all_gather_bytes(100, 4) == 300


def test_parameter_server_on_cpu_sends_weights_out_and_gradients_back():
    counted, per_device = _count(2, update=towerlib.ParameterServer(device="cpu"))
    expected = sorted(
        [(CPU, gpu, WEIGHTS, "variable") for gpu in (GPU0, GPU1)]
        + [(CPU, gpu, BIASES, "variable") for gpu in (GPU0, GPU1)]
        + [(CPU, gpu, X_SHARD, "input") for gpu in (GPU0, GPU1)]
        + [(CPU, gpu, Y_SHARD, "input") for gpu in (GPU0, GPU1)]
        + [(gpu, CPU, WEIGHTS, "computed") for gpu in (GPU0, GPU1)]   # gradients
        + [(gpu, CPU, BIASES, "computed") for gpu in (GPU0, GPU1)])
    assert _large_edges(counted) == expected
    assert not counted.collectives
    # CPU:0 sends 2 x (72 + 128) = 400 and receives 2 x 72 = 144 (+ scalars).
    assert 400 <= per_device[CPU][0] <= 400 + 4 * SCALAR_BYTES
    assert 144 <= per_device[CPU][1] <= 144 + 4 * SCALAR_BYTES
    _check_scalars_small(counted, per_device, expected)


def test_parameter_server_on_gpus_splits_the_variables():
    # Greedy by bytes: the weights (created first) on GPU:0, the biases on GPU:1.
    counted, per_device = _count(2, update=towerlib.ParameterServer(device="gpu"))
    expected = sorted(
        [(GPU0, GPU1, WEIGHTS, "variable"), (GPU1, GPU0, BIASES, "variable"),
         (GPU1, GPU0, WEIGHTS, "computed"), (GPU0, GPU1, BIASES, "computed")]
        + [(CPU, gpu, X_SHARD, "input") for gpu in (GPU0, GPU1)]
        + [(CPU, gpu, Y_SHARD, "input") for gpu in (GPU0, GPU1)])
    assert _large_edges(counted) == expected
    _check_scalars_small(counted, per_device, expected)


def test_replicated_moves_only_the_all_reduce_and_the_input():
    counted, per_device = _count(2, update="replicated", exchange="collective")
    expected = sorted([(CPU, gpu, X_SHARD, "input") for gpu in (GPU0, GPU1)]
                      + [(CPU, gpu, Y_SHARD, "input") for gpu in (GPU0, GPU1)])
    assert _large_edges(counted) == expected  # no weight, no gradient crosses
    # One packed all-reduce of both gradients (72 bytes) per GPU, by the ring:
    # 2 (2 - 1) / 2 x 72 = 72 bytes sent and received by each.
    parts = sorted((p.device, p.kind, p.group_size, p.payload_bytes, p.sent_bytes,
                    p.received_bytes) for p in counted.collectives)
    assert parts == [(GPU0, "all-reduce", 2, 72, 72, 72), (GPU1, "all-reduce", 2, 72, 72, 72)]
    _check_scalars_small(counted, per_device, expected)


def test_replicated_on_four_towers_follows_the_ring_formula():
    counted, per_device = _count(4, update="replicated", exchange="collective")
    assert not [e for e in counted.edges if e.kind == "variable"]
    assert [p.sent_bytes for p in counted.collectives] == [2 * 3 / 4 * 72] * 4  # 108
    for index in range(4):
        sent, received = per_device[f"/device:GPU:{index}"]
        assert 108 <= sent <= 108 + 4 * SCALAR_BYTES
        # The 2-example shards: x [2, 5] 40 bytes and y [2, 3] 24 bytes.
        assert 108 + 64 <= received <= 108 + 64 + 4 * SCALAR_BYTES


def test_step_excludes_initializers():
    # The replicated copies' initializers read tower 0's variables on GPU:0:
    # that is not part of a step, so nothing may come of it.
    with tf.Graph().as_default():
        with tf.device(CPU):
            x = tf.constant(np.zeros((8, 5), np.float32))
            y = tf.constant(np.zeros((8, 3), np.float32))
        train = towerlib.build_train_graph(
            _dense_tower, (x, y), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=[GPU0, GPU1], summaries=False, update="replicated")
        names = {op.name for op in traffic_placement.step_ops(train.train_op)}
        initializers = [v.initializer.name for v in tf.compat.v1.local_variables()]
        assert initializers and not names.intersection(initializers)


@pytest.mark.parametrize("update", ["ps/cpu", "replicated"])
def test_bench_row_on_a_small_resnet(update):
    row = traffic_rows.build_and_count("resnet8", 2, update, global_batch=8)
    _, sent, received = row.busiest
    if update == "ps/cpu":  # the CPU sends the weights twice, receives two gradients
        assert received >= 2 * row.weight_bytes and sent >= 2 * row.weight_bytes
    else:  # 2 towers: the ring moves S each way per GPU
        assert received >= row.weight_bytes
        assert not [e for e in row.traffic.edges if e.kind == "variable"]


@pytest.mark.parametrize("options", [
    dict(update=towerlib.ParameterServer(device="cpu")),
    dict(update=towerlib.ParameterServer(device="gpu")),
    dict(update="replicated", exchange="graph"),
], ids=["ps_cpu", "ps_spread", "replicated_graph"])
def test_placement_matches_tensorflows_own_partitioning(options):
    """The counted edges are the Sends TensorFlow makes when it runs the step.

    GPUs cannot run here, so the towers go on virtual CPUs 1 and 2 (the host
    CPU:0 keeps the input and, for 'ps_cpu', the variables), one step runs
    with partition graphs returned, and every _Send above scalar size is
    summed per (source, destination) device pair. Graph rewrites and
    constant folding are off and the batch is fed, so that every Send is of a
    tensor of the built graph.
    """
    towers = ["/device:CPU:1", "/device:CPU:2"]
    with tf.Graph().as_default() as graph:
        with tf.device(CPU):
            x = tf.compat.v1.placeholder(tf.float32, [8, 5])
            y = tf.compat.v1.placeholder(tf.float32, [8, 3])
        train = towerlib.build_train_graph(
            _dense_tower, (x, y), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=towers, summaries=False, **options)
        counted = collections.Counter()
        for edge in traffic_count.count_traffic(train.train_op).edges:
            if edge.num_bytes > SCALAR_BYTES:
                counted[(edge.source, edge.destination)] += edge.num_bytes
        config = towerlib.session_config(3, allow_soft_placement=False)
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
        config.graph_options.optimizer_options.do_constant_folding = False
        metadata = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            session.run(train.train_op, {x: np.zeros([8, 5]), y: np.zeros([8, 3])},
                        options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                        run_metadata=metadata)
    sent = collections.Counter()
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if node.op != "_Send" or "/ctrl/" in node.input[0]:
                continue  # a cross-device control edge's empty dummy tensor
            tensor = graph.get_tensor_by_name(
                node.input[0] if ":" in node.input[0] else node.input[0] + ":0")
            num_bytes = tensor.shape.num_elements() * tensor.dtype.size
            if num_bytes > SCALAR_BYTES:
                devices = [tf.DeviceSpec.from_string(node.attr[key].s.decode())
                           .replace(job=None, replica=None, task=None).to_string()
                           for key in ("send_device", "recv_device")]
                sent[tuple(devices)] += num_bytes
    assert counted == sent
