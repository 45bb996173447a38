"""bench/traffic_machines.py counts what crosses between machines: checked by hand.

The graph: W = 2 machines x N = 2 GPU towers (worker r's towers on
'/job:worker/task:r/device:GPU:i', built, never run), one dense layer
5 -> 3 (weights 15 floats = 60 bytes, biases 3 floats = 12 bytes: S = 72),
plain SGD, each worker's batch x [4, 5] and y [4, 3] made on its own host,
so no input crosses a machine.

All-reduce (no ps task): the two gradients are packed into one buffer with
the step's riders (the global loss and activity terms, 8 bytes: the batch
sizes are static, so their total crossed once at start), 72 + 8 = 80 bytes,
all-reduced over G = W x N = 4 members. A ring ordered machine by machine
crosses between the machines twice (W hops), each hop carrying
2 (G - 1) / G x 80 = 120 bytes: each machine's link sends 120 and receives
120, and nothing else crosses per step. No graph edge crosses a machine.

Parameter server, P = 2 ps tasks on machines of their own: the placer puts
the global step (8 bytes) on ps 0, the weights on ps 1 and the biases on
ps 0. Per step a worker pushes one summed gradient per variable (60 to
ps 1, 12 to ps 0) and its local step (8 bytes) to each, and each of its 2
towers reads both variables: 2 x 60 from ps 1, 2 x 12 from ps 0, plus the
8-byte sync token from ps 0. So a worker link sends 60 + 12 + 2 x 8 = 88
and receives 2 x 72 + 8 = 152; ps 1 sends 2 workers x 120 = 240.
"""

import pytest
import tensorflow as tf

from bench import traffic_machines as tm
from bench import traffic_machines_report as report
from towerlib import layers

WEIGHTS, BIASES = 60, 12
S = WEIGHTS + BIASES
W0, W1 = "/job:worker/task:0", "/job:worker/task:1"
PS0, PS1 = "/job:ps/task:0", "/job:ps/task:1"
SCALAR_BYTES = 8
RIDERS = 8  # the global loss and activity terms, in the gradients' buffer


def _dense_tower(inputs, ctx):
    x, y = inputs
    return tf.reduce_mean(tf.square(layers.dense(x, 3, name="fc") - y))


def _decayed_dense_tower(inputs, ctx):
    x, y = inputs
    return tf.reduce_mean(tf.square(
        layers.dense(x, 3, name="fc", weight_decay=0.01) - y))


def _inputs():
    return tf.zeros([4, 5], tf.float32), tf.zeros([4, 3], tf.float32)


def _count(path, worker_index=0, num_ps=0, tower=_dense_tower, workers=2, towers=2):
    graph, train_op = tm.build_worker_step(
        tower, _inputs, workers, towers, path, num_ps=num_ps, worker_index=worker_index,
        optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with graph.as_default():
        return tm.count_worker(train_op, workers)


def _large(task_bytes):
    """{(source, destination): bytes} without the scalar-only pairs."""
    return {pair: b for pair, b in task_bytes.items() if b > SCALAR_BYTES}


def test_ring_crossing_formula():
    # 2 machines x 2 GPUs: 2 (4 - 1) / 4 x 72 = 108 bytes each way per link.
    assert tm.ring_crossing_bytes(tm.ALL_REDUCE, 72, 4, 2) == 108
    # 8 machines x 8 GPUs: 2 x 63 / 64 of the payload.
    assert tm.ring_crossing_bytes(tm.ALL_REDUCE, 64, 64, 8) == 126
    # A group all on one machine crosses nothing.
    assert tm.ring_crossing_bytes(tm.ALL_REDUCE, 72, 2, 2) == 0
    # All-gather of S each among G: (G - 1) x S per hop.
    assert tm.ring_crossing_bytes("all-gather", 10, 4, 2) == 30
    # The two-level reference: 2 (W - 1) / W x S.
    assert tm.hierarchical_bytes(72, 2) == 72
    assert tm.hierarchical_bytes(72, 1) == 0


def test_task_of():
    assert tm.task_of("/job:worker/replica:0/task:3/device:GPU:1") == "/job:worker/task:3"
    assert tm.task_of("/job:ps/task:0/device:CPU:0") == "/job:ps/task:0"
    assert tm.task_of("/job:worker/task:2") == "/job:worker/task:2"


@pytest.mark.parametrize("worker_index", [0, 1])
def test_all_reduce_crosses_machines_only_through_the_ring(worker_index):
    counted = _count(tm.ALL_REDUCE, worker_index)
    assert counted.worker == f"/job:worker/task:{worker_index}"
    assert counted.task_bytes == {}  # no graph edge leaves the worker
    # One exchange a step: the gradients, carrying the riders.
    assert [(g.kind, g.payload_bytes, g.group_size, g.local_members, g.crossing_bytes)
            for g in counted.groups] == [(tm.ALL_REDUCE, S + RIDERS, 4, 2, 120)]
    assert counted.crossing_bytes == 120
    links = counted.machine_links()
    assert set(links) == {W0, W1}
    assert links[W0] == links[W1] == (counted.crossing_bytes, counted.crossing_bytes)


@pytest.mark.parametrize("worker_index", [0, 1])
def test_parameter_server_sends_one_gradient_up_and_reads_each_weight_once(worker_index):
    """Each variable crosses down once per worker and step (read on the worker's CPU,
    a caching device, and handed to its towers there), the towers' summed gradient up."""
    counted = _count(tm.PS_SEPARATE, worker_index, num_ps=2)
    worker = f"/job:worker/task:{worker_index}"
    assert not counted.groups
    assert _large(counted.task_bytes) == {
        (worker, PS1): WEIGHTS + SCALAR_BYTES,  # the summed gradient + the local step
        (worker, PS0): BIASES + SCALAR_BYTES,
        (PS1, worker): WEIGHTS,  # the weights, once for both towers
        (PS0, worker): BIASES + SCALAR_BYTES,  # ... and the biases; the sync token
    }
    links = counted.machine_links()
    assert links[W0] == links[W1] == (88, 80)
    assert links[PS1][0] == 2 * WEIGHTS  # once per worker
    assert 2 * (WEIGHTS + SCALAR_BYTES) <= links[PS1][1] <= 2 * (WEIGHTS + SCALAR_BYTES) + 4
    # The chief's graph alone also sends ps 1 the learning rate from ps 0 (4 bytes).
    assert 2 * (BIASES + SCALAR_BYTES) <= links[PS0][0] <= 2 * (BIASES + SCALAR_BYTES) + 4
    assert links[PS0][1] == 2 * (BIASES + SCALAR_BYTES)


def test_parameter_server_on_the_worker_machines_keeps_local_traffic_off_the_link():
    counted = _count(tm.PS_SEPARATE, 0, num_ps=2)
    links = counted.machine_links(tm.colocated(2))
    assert set(links) == {W0, W1}
    # Machine 0 (worker 0 + ps 0) sends worker 0's 68 bytes to ps 1 and ps 0's
    # 12 + 8 to worker 1, plus ps 0's learning rate to ps 1 (4, the chief's graph):
    # 68 + 20 + 4. It receives ps 1's 60 for worker 0 and worker 1's 20 for ps 0.
    assert links[W0] == (68 + 20 + 4, 60 + 20)
    # Machine 1 (worker 1 + ps 1) mirrors it: 20 + 60 out, 20 + 68 + 4 in.
    assert links[W1] == (20 + 60, 20 + 68 + 4)


def test_weight_decay_still_sends_one_gradient_to_the_ps():
    """With the weights read on the worker (the caching device), the decay term is
    computed there too, and the towers' gradients are summed on the worker
    (towerlib/update/aggregation.py): one kernel-sized gradient goes up, with 4
    towers as with 1.
    """
    counted = _count(tm.PS_SEPARATE, 0, num_ps=2, tower=_decayed_dense_tower, towers=4)
    crossing = [e for e in counted.traffic.edges
                if e.num_bytes == WEIGHTS and e.kind == "computed"
                and tm.task_of(e.source) == W0 and tm.task_of(e.destination) == PS1]
    assert len(crossing) == 1, [e.tensor for e in crossing]


@pytest.mark.slow  # two ResNet-8 builds: 15-30 s on 2 shared cores
def test_bench_rows_on_a_small_model():
    rows = report.rows_for("resnet8", 2, 2)
    by_path = {row.path: row for row in rows}
    assert set(by_path) == {tm.ALL_REDUCE, tm.HIERARCHICAL, tm.PS_SEPARATE, tm.PS_COLOCATED}
    allreduce = by_path[tm.ALL_REDUCE]
    # The ring's bytes per link: 2 (G - 1) / G = 1.5 of the gradients at G = 4.
    _, sent, received = allreduce.busiest
    assert sent == received
    assert 1.5 * allreduce.weight_bytes <= sent <= 1.5 * allreduce.weight_bytes + 1e4
    # Every weight read once per worker (S down), and, every weight being decayed,
    # the decay term's gradient, computed on the ps next to the variable (S down);
    # up: the towers' summed gradient and the value the decay term reads (2 S).
    ps = by_path[tm.PS_SEPARATE]
    up, down = report.worker_up_down(ps)
    assert 1.9 * ps.weight_bytes <= down <= 2 * ps.weight_bytes + 1e4
    assert 1.9 * ps.weight_bytes <= up <= 2 * ps.weight_bytes + 1e4  # BN statistics: no decay
    assert ps.floor_seconds(25e9) > allreduce.floor_seconds(25e9)
    table = report.markdown_table(rows, [25, 100])
    assert table.count("\n") == 1 + len(rows)
    assert "resnet8 | 2 x 2 | all-reduce" in table
