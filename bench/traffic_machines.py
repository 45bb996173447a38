"""Bytes each machine's network link carries per training step, W machines x N devices.

bench/traffic_count.py counts what crosses between the devices of one
machine. Across machines the link that bounds a step is each machine's
network link, so this module takes the built graph of ONE worker (worker r
of W, its N towers on '/job:worker/task:r/device:GPU:i'; nothing is run)
and counts what crosses between tasks, where a task is a machine: a worker,
or a ps task (on its own machine, or sharing worker p's, see below).

Parameter server (towerlib.cluster.build_sync_train_graph with ps tasks).
  Graph edges between tasks carry a tensor's bytes once per step, one
  Send/Recv pair per (tensor, destination device), placed by the placer's
  rules (bench/traffic_placement.py): exactly traffic_count's model of
  edges, whose partition-graph check is in tests/bench/test_traffic.py.
  What crosses: each worker pushes one gradient per variable (its towers'
  sum, computed on the worker) to the variable's ps task, and each TOWER
  reads each variable from its ps task (a ReadVariableOp per tower, so N
  reads per worker: N x S down for S bytes of weights), plus a few 8-byte
  scalars (the local step, the sync token). The worker's graph says what
  worker r exchanges with each ps task; every worker builds the same graph
  (same model, same ParameterServerPlacer order) but for its task, so the
  W workers' edges are worker r's with the task renamed, and a ps task's
  link carries the sum over workers. Edges between ps tasks (the chief's
  apply reads the learning rate from another ps task) are counted once.
  Two deployments: P ps tasks on P machines of their own, or ps task p on
  worker machine p (P = W, tf_cnn_benchmarks' usual layout), where traffic
  between worker p and ps task p stays inside the machine.

All-reduce across workers (update=towerlib.Replicated(), no ps task).
  No graph edge crosses tasks (a test checks it); the collectives do. A
  collective op of the step has a payload S (its input tensor's bytes), a
  group of G = W x N members (the group_size attribute) and n members on
  this worker (the ops with its group and instance keys here). Model: a
  ring over the G members ordered machine by machine. That is how the
  members are ranked: TensorFlow's CPU ring orders them by device name,
  so one task's devices are consecutive (its GPU subdivisions permute
  devices within a task, keeping tasks in order); NCCL builds its rings
  through each node's GPUs then out of the node's NIC to the next node.
  In the standard ring all-reduce (reduce-scatter, then all-gather: 2 (G - 1)
  steps, each passing an S / G chunk to the next member) every hop of the
  ring carries 2 (G - 1) / G x S; of the G hops only the G / n between
  machines cross a link, one leaving and one entering each machine. So
  each machine's link sends 2 (G - 1) / G x S and receives as much, per
  buffer (an all-gather of S bytes each: (G - 1) x S). Summed over the
  step's collectives that is about 2 S for S bytes of gradients, whatever
  W: the ring's cost per link does not grow with the machines.

  Would NCCL's other algorithms change it? Not the bytes, by argument
  rather than measurement (there is no GPU here). Its double binary tree
  splits the buffer over two trees; a machine is an inner node (two
  children) in one and a leaf in the other, and per tree of S / 2 an inner
  node receives 2 x S / 2 and sends S / 2 up, then receives S / 2 and
  sends 2 x S / 2 down; a leaf sends and receives S / 2: 2 S each way in
  all, at least the ring's 2 (G - 1) / G x S. The tree wins on latency
  (log W steps against 2 (G - 1)), which matters for small buffers, not
  for the byte floor. A hierarchical all-reduce (reduce-scatter inside the
  machine, N rings of W members across machines each on S / N, all-gather
  inside), which towerlib does not build, moves 2 (W - 1) / W x S per
  machine: the least any all-reduce can move when every machine holds its
  own gradients, 1.00 S at W = 2 against the flat ring's 1.88 S (the
  reports show it as a reference row).

The floor: max over machine links of max(sent, received) x 8 / bandwidth,
assuming full-duplex links (sending and receiving do not compete) into a
non-blocking fabric, and no overlap of communication with compute or with
itself. A lower bound on the step's communication time, not a step time:
latency per message, the protocol (gRPC for the parameter server) and a
shared NIC only add to it; overlapping the exchange with the backward
pass only hides it.
"""

import collections
import contextlib
import dataclasses
import re
from typing import Dict, List, Tuple
from unittest import mock

import tensorflow as tf

import towerlib
from bench.traffic_count import Traffic, count_traffic, ring_all_gather_bytes, ring_all_reduce_bytes
from towerlib import cluster as cluster_lib
from towerlib.step import devices as devices_lib

ALL_REDUCE = "all-reduce"
PS_SEPARATE = "ps"
PS_COLOCATED = "ps-colocated"
HIERARCHICAL = "hierarchical"


def task_of(device: str) -> str:
    """'/job:worker/replica:0/task:1/device:GPU:3' -> '/job:worker/task:1' (one machine)."""
    spec = tf.DeviceSpec.from_string(device)
    if spec.job is None:
        return "/job:localhost/task:0"
    return f"/job:{spec.job}/task:{spec.task or 0}"


@dataclasses.dataclass(frozen=True)
class CollectiveGroup:
    """One collective of the step, as this worker takes part in it.

    payload_bytes is S, one member's input; crossing_bytes what each
    machine's link sends (and receives) for it by the ring model: 0 when
    the whole group is on this worker.
    """

    name: str
    kind: str  # 'all-reduce' or 'all-gather'
    group_size: int  # G, every worker's members
    local_members: int  # n, this worker's
    payload_bytes: int
    crossing_bytes: float


def ring_crossing_bytes(kind: str, payload_bytes: float, group_size: int,
                        local_members: int) -> float:
    """Bytes one machine's link sends (and receives) for one collective.

    A ring over `group_size` members ordered machine by machine, each
    machine holding `local_members` consecutive ones: one hop leaves the
    machine and one enters it, each carrying what every hop carries,
    2 (G - 1) / G x S for an all-reduce, (G - 1) x S for an all-gather.
    E.g. 2 machines x 2 GPUs, S = 72: 2 x 3 / 4 x 72 = 108 bytes each way.
    """
    if group_size <= local_members:
        return 0.0
    if kind == ALL_REDUCE:
        return ring_all_reduce_bytes(payload_bytes, group_size)
    return ring_all_gather_bytes(payload_bytes, group_size)


def _keys(op) -> Tuple:
    """(group key, instance key) of a collective op; None for a one-process op (NCCL V1)."""
    if "group_key" in op.node_def.attr:
        return int(op.get_attr("group_key")), int(op.get_attr("instance_key"))
    if op.type.startswith("Collective") and len(op.inputs) >= 4:  # V2: keys are inputs
        return (int(tf.get_static_value(op.inputs[2])),
                int(tf.get_static_value(op.inputs[3])))
    return None


def collective_groups(traffic: Traffic, graph: tf.Graph) -> List[CollectiveGroup]:
    """The step's collectives grouped by key, with each one's crossing bytes."""
    members = collections.defaultdict(list)
    for part in traffic.collectives:
        op = graph.get_operation_by_name(part.op)
        members[_keys(op) or ("local", part.op)].append(part)
    groups = []
    for parts in members.values():
        first = parts[0]
        local = len(parts) if _keys(graph.get_operation_by_name(first.op)) else first.group_size
        groups.append(CollectiveGroup(
            first.op, first.kind, first.group_size, local, first.payload_bytes,
            ring_crossing_bytes(first.kind, first.payload_bytes, first.group_size, local)))
    return groups


@dataclasses.dataclass
class WorkerCount:
    """What one worker's step moves between machines.

    Attributes:
      worker: this worker's task, '/job:worker/task:r'.
      num_workers: W.
      task_bytes: {(source task, destination task): bytes} of the graph edges
        that cross tasks, in this worker's graph.
      groups: the step's collectives (empty for the parameter server).
      traffic: the device-level count it came from.
    """

    worker: str
    num_workers: int
    task_bytes: Dict[Tuple[str, str], float]
    groups: List[CollectiveGroup]
    traffic: Traffic

    @property
    def crossing_bytes(self) -> float:
        """Bytes the collectives send (and receive) over each worker machine's link."""
        return sum(g.crossing_bytes for g in self.groups)

    def all_tasks_bytes(self) -> Dict[Tuple[str, str], float]:
        """Every worker's cross-task edges: this worker's, renamed for each of the W.

        Edges not touching this worker (ps task to ps task) are counted once.
        """
        total = collections.Counter()
        job, index = re.fullmatch(r"/job:(\w+)/task:(\d+)", self.worker).groups()
        for (source, destination), num_bytes in self.task_bytes.items():
            if self.worker not in (source, destination):
                total[(source, destination)] += num_bytes
                continue
            for other in range(self.num_workers):
                rename = f"/job:{job}/task:{other}"
                total[(rename if source == self.worker else source,
                       rename if destination == self.worker else destination)] += num_bytes
        return dict(total)

    def machine_links(self, machine_of=None) -> Dict[str, Tuple[float, float]]:
        """{machine: (bytes sent, bytes received) over its link} in one step, all W workers.

        Args:
          machine_of: task -> machine name; default: every task its own machine.
            Edges between tasks of one machine do not use its link.
        """
        machine_of = machine_of or (lambda task: task)
        sent, received = collections.Counter(), collections.Counter()
        workers = [re.sub(r"task:\d+$", f"task:{w}", self.worker)
                   for w in range(self.num_workers)]
        for task in workers:
            sent[machine_of(task)] += self.crossing_bytes
            received[machine_of(task)] += self.crossing_bytes
        for (source, destination), num_bytes in self.all_tasks_bytes().items():
            if machine_of(source) != machine_of(destination):
                sent[machine_of(source)] += num_bytes
                received[machine_of(destination)] += num_bytes
        machines = sorted(set(sent) | set(received))
        return {m: (sent[m], received[m]) for m in machines}


def count_worker(train_op, num_workers: int) -> WorkerCount:
    """Counts one worker's built step (its towers on '/job:worker/task:r/...')."""
    traffic = count_traffic(train_op)
    graph = (train_op if isinstance(train_op, tf.Operation) else train_op.op).graph
    workers = sorted({task_of(d) for d in traffic.devices.values()
                      if d.startswith(("/job:worker", "/job:chief"))})
    if len(workers) != 1:
        raise ValueError(f"Expected one worker task in the step, found {workers}.")
    task_bytes = collections.Counter()
    for edge in traffic.edges:
        source, destination = task_of(edge.source), task_of(edge.destination)
        if source != destination:
            task_bytes[(source, destination)] += edge.num_bytes
    return WorkerCount(workers[0], num_workers, dict(task_bytes),
                       collective_groups(traffic, graph), traffic)


def colocated(num_ps: int):
    """machine_of for ps task p on worker machine p (P <= W): '/job:ps/task:p' -> worker p."""
    def machine_of(task):
        match = re.fullmatch(r"/job:ps/task:(\d+)", task)
        if match and int(match.group(1)) < num_ps:
            return f"/job:worker/task:{match.group(1)}"
        return task
    return machine_of


@contextlib.contextmanager
def pretend_gpus(count: int):
    """This machine answers `count` GPUs to towerlib.cluster.tower_devices.

    The cluster builders ask the machine how many GPUs it has; building
    needs none (nothing runs), so the graph of a GPU worker can be built here.
    """
    with mock.patch.object(devices_lib, "local_gpu_count", lambda: count):
        yield


def fake_cluster(num_workers: int, num_ps: int, worker_index: int):
    """A ClusterInfo of W workers and P ps tasks on made-up hosts (no server starts)."""
    return cluster_lib.cluster_from_flags(
        ps_hosts=",".join(f"ps{p}.example:2222" for p in range(num_ps)),
        worker_hosts=",".join(f"worker{w}.example:2222" for w in range(num_workers)),
        job_name="worker", task_index=worker_index)


def build_worker_step(model, make_inputs, num_workers: int, towers: int, path: str,
                      num_ps: int = 0, worker_index: int = 0, bn_mode: str = "first_tower",
                      optimizer=None, device_type: str = "gpu"):
    """Worker `worker_index`'s training step, built (never run) in a new graph.

    Args:
      model: a tower function or towerlib.TowerModel.
      make_inputs: () -> this worker's part of the global batch, called on the
        worker's host (under its CPU, or the ParameterServerPlacer).
      path: 'all-reduce' (update=towerlib.Replicated(), no ps task) or 'ps'
        (num_ps ps tasks, SyncReplicasOptimizer).
      device_type: 'gpu' (towers on GPU strings, NCCL collectives) or 'cpu'.

    Returns:
      (graph, train op).
    """
    optimizer = optimizer or tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    graph = tf.Graph()
    with graph.as_default(), pretend_gpus(towers):
        if path == ALL_REDUCE:
            cluster = fake_cluster(num_workers, 0, worker_index)
            with tf.device(f"{cluster.task_device}/device:CPU:0"):
                inputs = make_inputs()
            built = cluster_lib.build_sync_train_graph(
                model, inputs, optimizer, cluster, num_towers=towers,
                device_type=device_type, update=towerlib.Replicated(), bn_mode=bn_mode,
                summaries=False)
        elif path == PS_SEPARATE:
            cluster = fake_cluster(num_workers, num_ps, worker_index)
            placer = cluster_lib.ParameterServerPlacer(cluster)
            with tf.compat.v1.device(placer):
                inputs = make_inputs()
            built = cluster_lib.build_sync_train_graph(
                model, inputs, optimizer, cluster, num_towers=towers,
                device_type=device_type, bn_mode=bn_mode, device_function=placer,
                summaries=False)
        else:
            raise ValueError(f"path must be {ALL_REDUCE!r} or {PS_SEPARATE!r}, not {path!r}.")
    return graph, built.train_graph.train_op


def trainable_bytes(graph: tf.Graph) -> int:
    """S: the bytes of the trainable variables (one copy: tower 0's for replicated)."""
    with graph.as_default():
        variables = tf.compat.v1.trainable_variables()
    return sum(v.shape.num_elements() * v.dtype.base_dtype.size for v in variables)


def hierarchical_bytes(payload_bytes: float, num_workers: int) -> float:
    """Per machine link, a two-level all-reduce of S bytes: 2 (W - 1) / W x S.

    Inside each machine a reduce-scatter leaves each of its N GPUs an S / N
    shard; N rings of W members (GPU i of every machine) all-reduce the
    shards across machines, 2 (W - 1) / W x S / N each, all through the
    machine's link; an all-gather inside finishes. towerlib does not build
    it: a reference for what the flat ring could save.
    """
    return ring_all_reduce_bytes(payload_bytes, num_workers) if num_workers > 1 else 0.0
