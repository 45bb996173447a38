"""Small sums carried in the gradients' all-reduce (the step's riders).

Across workers the step's losses and the chief's moving statistics cross in
the gradients' first buffer instead of exchanges of their own. Here on one
machine's CPU towers (the graph transport), where each exchange is one hub op:
the riders' sums are exact and add no exchange, and with half-precision wire
gradients they keep float32 in one exchange of their own.
"""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib.exchange.reducer import CrossTowerReducer
from towerlib.update.allreduce import allreduce_gradients

DEVICES = ["/device:CPU:0", "/device:CPU:1"]


def hub_ops(graph):
    return [op for op in graph.get_operations()
            if op.name.startswith("cross_tower_exchange") and op.type in ("AddN", "ConcatV2")]


@pytest.mark.parametrize("wire_dtype, exchanges", [
    (None, 1), pytest.param(tf.bfloat16, 2, marks=pytest.mark.half_precision)])
def test_riders_are_summed_exactly_in_the_gradients_first_buffer(wire_dtype, exchanges):
    rng = np.random.RandomState(0)
    gradients = [[rng.randn(3, 2).astype(np.float32), rng.randn(4).astype(np.float32)]
                 for _ in DEVICES]
    # Values a half type cannot hold: the riders must stay float32.
    riders = [[np.array([1.0 + 2 ** -20, 3.0, 1e-7], np.float32)],
              [np.array([2.0, -1.0 / 3.0, 0.0], np.float32)]]
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(DEVICES, transport="graph")
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            reduced, summed = allreduce_gradients(
                reducer, [[tf.constant(g) for g in tower] for tower in gradients],
                pack_bytes=1 << 20, wire_dtype=wire_dtype,
                riders=[[tf.constant(r) for r in tower] for tower in riders])
            assert len(hub_ops(graph)) == exchanges
            got_sums, got_reduced = session.run([summed, reduced])
    expected = riders[0][0] + riders[1][0]
    for tower in range(2):
        np.testing.assert_array_equal(got_sums[tower][0], expected)
        # bfloat16 wire (u = 2**-8): each part rounded (u |part|), their sum rounded
        # (u |sum| <= u sum|part|): within 2 u sum|part|. float32: exact.
        u = 0 if wire_dtype is None else 2.0 ** -8
        for got, *parts in zip(got_reduced[tower], *gradients):
            bound = 2 * u * sum(np.abs(part) for part in parts)
            assert np.all(np.abs(got - sum(parts)) <= bound), (got, sum(parts))


def test_a_parameter_server_takes_no_riders():
    with tf.Graph().as_default():
        update = towerlib.ParameterServer().build(2, None)
        with pytest.raises(ValueError, match="no riders"):
            update.combine([[], []], riders=[[tf.zeros([2])], [tf.zeros([2])]])
