"""One row of bench/traffic.py's tables: a training graph built on GPU strings, counted.

A row is one (model, tower count, variable update). Its graph is built with
towers on '/device:GPU:0' ... '/device:GPU:<T-1>' and never run, so no GPU is
needed; the global batch, [B, 32, 32, 3] float32 images and [B] int32
labels, is made on '/device:CPU:0' and split there, as an input pipeline's
output would be, so the input's bytes cross from the host to every tower
the same way in every variable update.
"""

import collections
import dataclasses
from typing import Dict, Tuple

import tensorflow as tf

import towerlib
from bench.traffic_count import Traffic, count_traffic
from bench.traffic_model import make_traffic_model

# Each way of updating the variables: (label, build_train_graph options).
VARIABLE_UPDATES = (
    ("ps/cpu", dict(update=towerlib.ParameterServer(device="cpu"))),
    ("ps/gpu", dict(update=towerlib.ParameterServer(device="gpu"))),
    ("replicated", dict(update="replicated", exchange="collective")),
)


@dataclasses.dataclass
class TrafficRow:
    """One model, tower count and variable update, counted."""

    model: str
    towers: int
    update: str
    weight_bytes: int  # the trainable variables, once
    traffic: Traffic
    weights_by_device: Dict[str, int]  # bytes of tower 0's trainable variables per device

    @property
    def busiest(self) -> Tuple[str, float, float]:
        """(device, sent, received) of the device with the largest max(sent, received).

        That device's link is the one that bounds the step (`floor_seconds`).
        """
        per_device = self.traffic.per_device()
        device = max(per_device, key=lambda d: max(per_device[d]))
        return (device,) + per_device[device]

    @property
    def total_bytes(self) -> float:
        """Bytes moved in the step: the sum over devices of bytes sent."""
        return sum(sent for sent, _ in self.traffic.per_device().values())

    @property
    def input_bytes(self) -> float:
        """Bytes of the input batch (and constants) that cross devices."""
        return sum(sent for sent, _ in self.traffic.per_device(["input"]).values())

    def floor_seconds(self, bandwidth_bytes_per_second: float) -> float:
        """The least time one full-duplex link per device needs to carry the step.

        max(sent, received) of the busiest device / W: a lower bound on the
        communication time, not a prediction of the step time (latency,
        shared PCIe switches and the protocol add to it; overlap with the
        backward pass hides it).
        """
        _, sent, received = self.busiest
        return max(sent, received) / bandwidth_bytes_per_second


def build_and_count(model_name: str, num_towers: int, update: str, global_batch: int,
                    bn_mode: str = "first_tower") -> TrafficRow:
    """Builds one training graph on GPU device strings (never run) and counts it.

    Args:
      model_name: 'resnet50_sized' or a model of the CIFAR example.
      num_towers: T, the towers '/device:GPU:0' ... '/device:GPU:<T-1>'.
      update: a label of VARIABLE_UPDATES ('ps/cpu', 'ps/gpu', 'replicated').
      global_batch: B; only the input batch's bytes depend on it.
      bn_mode: towerlib's batch-norm mode.
    """
    options = dict(VARIABLE_UPDATES)[update]
    model = make_traffic_model(model_name)
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/device:CPU:0"):  # the input pipeline's host
            images = tf.zeros([global_batch, 32, 32, 3], tf.float32, name="images")
            labels = tf.zeros([global_batch], tf.int32, name="labels")
        train = towerlib.build_train_graph(
            model, (images, labels), tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
            devices=[f"/device:GPU:{i}" for i in range(num_towers)], bn_mode=bn_mode,
            summaries=False, **options)
        counted = count_traffic(train.train_op)
        weights_by_device = collections.Counter()
        for variable in tf.compat.v1.trainable_variables():
            weights_by_device[counted.devices[variable.op.name]] += (
                variable.shape.num_elements() * variable.dtype.base_dtype.size)
        return TrafficRow(model_name, num_towers, update, sum(weights_by_device.values()),
                          counted, dict(weights_by_device))
