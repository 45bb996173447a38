"""Training across workers by all-reduce: no ps task, every worker its own copies.

A cluster without ps tasks trains with `towerlib.Replicated()` spanning every
worker: each worker builds its own towers with a copy of every variable, and
the exchange that sums the gradients on one machine sums them over every
tower of every worker (one collective group; towerlib.exchange.WorkerGroup).
Each step is one optimizer update on the mean loss of the whole global batch,
applied by every worker to its own copies, which therefore stay bit-identical.

    cluster = cluster_lib.resolve_cluster(worker_hosts=HOSTS, job_name="worker",
                                          task_index=r)           # no ps_hosts
    server = cluster_lib.start_server(cluster, num_towers)
    graph = cluster_lib.build_sync_train_graph(
        model, my_shard_of_the_batch, optimizer, cluster, num_towers=num_towers,
        update=towerlib.Replicated())
    cluster_lib.run_distributed_training(graph, server, train_dir=..., max_steps=...)

Starting. Every worker waits until every other worker accepts connections,
then the workers agree on the checkpoint to resume from: the newest global
step that the chief and every worker have in their own folder (the chief's
`train_dir`, worker r's `train_dir/worker_<r>`); each restores its own, its
input position included, and the chief's values are broadcast to every
copy. A worker that has no checkpoint of that step starts its data afresh
(a warning says so).

Faults. TensorFlow's collectives cannot recover in a process once one has
failed, so a lost worker ends the job: every step carries a deadline
(`step_deadline_secs`); a killed worker fails the others' step at once, a
stopped or missing one at the deadline, and every worker raises
WorkerLostError with one line naming the task and saying to restart every
worker with the same command (the job then resumes as above).
"""

import copy
import dataclasses
import logging
import os
import time
from typing import Any, Tuple

import numpy as np
import tensorflow as tf

from towerlib.cluster import agreement, placement, recovery, replica_watch
from towerlib.cluster.spec import ClusterInfo
from towerlib.internals import collective_ops
from towerlib.run import checkpoints, data_position, global_batches
from towerlib.run import trainer as trainer_lib
from towerlib.step import inputs as inputs_lib
from towerlib.step.build import build_train_graph
from towerlib.step.train_graph import TrainGraph
from towerlib.update import slot_shards
from towerlib.update.replicated import Replicated

__all__ = ["AllReduceTrainGraph", "WorkerLostError", "build_allreduce_train_graph",
           "run_allreduce_training", "worker_train_dir"]

logger = logging.getLogger("towerlib")

# The checkpoint agreement's collective group: apart from the training graph's.
_AGREEMENT_GROUP_KEY = 0x7B0001
_AGREEMENT_STEPS = 64
# The evaluation's agreement (early stopping): in the training graph, its own group.
_EVALUATION_GROUP_KEY = 0x7B0002
# What a failed collective across workers raises in TF 2.21.
_LOST_PEER_ERRORS = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
                     tf.errors.AbortedError, tf.errors.CancelledError,
                     tf.errors.InternalError)


class WorkerLostError(replica_watch.ReplicaLostError):
    """A worker of an all-reduce job was lost; every worker must be restarted."""


@dataclasses.dataclass(frozen=True)
class AllReduceTrainGraph:
    """A worker's all-reduce training graph and what running it needs.

    Attributes:
      train_graph: the TrainGraph; its exchange spans every worker's towers. Its
        fields (loss, tower_shares, ...) read through this object too.
      cluster: the ClusterInfo it was built for.
      session_config: the ConfigProto of this worker's server and sessions.
      hooks: extra session hooks (none).
      step_description: {item: text} of what defines the step, which every
        worker checks against the chief's at startup (towerlib.cluster.agreement).
    """

    train_graph: TrainGraph
    cluster: ClusterInfo
    session_config: Any
    hooks: Tuple[Any, ...] = ()
    step_description: Any = None  # agreement.describe_step, compared at startup

    def __getattr__(self, name):
        # TrainGraph's fields (loss, tower_shares, train_op...) read through, so a hook
        # written for one machine's TrainGraph works with either update.
        if name.startswith("__") or name == "train_graph":
            raise AttributeError(name)
        return getattr(self.train_graph, name)


def build_allreduce_train_graph(tower_fn, inputs, optimizer, cluster, *, num_towers=None,
                                device_type=None, update=None, **build_options):
    """This worker's step of an all-reduce job (towerlib.build_train_graph's options).

    `inputs` is this worker's own part of the global batch; the parts may
    differ in size (each example counts once in the global mean).
    """
    if cluster.num_ps:
        raise ValueError(
            f"update={update!r} trains with all-reduce across the workers, and this "
            f"cluster has {cluster.num_ps} ps task(s). Fix: drop the ps tasks "
            "(--ps_hosts), or use update=towerlib.ParameterServer() to train through them.")
    update = Replicated() if update is None else update
    devices = placement.tower_devices(cluster, num_towers, device_type)
    train_graph = build_train_graph(tower_fn, inputs, optimizer, devices=devices,
                                    update=update, workers=cluster.worker_group,
                                    **build_options)
    with train_graph.train_op.graph.as_default():
        description = agreement.describe_step(train_graph, optimizer,
                                              dict(build_options, update=update))
    return AllReduceTrainGraph(train_graph, cluster,
                               placement.session_config(cluster, len(devices)),
                               step_description=description)


def worker_train_dir(train_dir, cluster):
    """The folder this worker checkpoints into: the chief's is train_dir itself."""
    if cluster.is_chief:
        return str(train_dir)
    return os.path.join(str(train_dir), f"worker_{cluster.replica_index}")


def wait_for_workers(cluster, timeout_secs, poll_secs=0.5):
    """Blocks until every other worker accepts connections, else WorkerLostError."""
    def error(missing):
        who = ", ".join(f"{task} ({address})" for task, address in missing.items())
        return WorkerLostError(
            f"Worker {cluster.replica_index}: {who} did not start within "
            f"{timeout_secs:.0f} s. Fix: start every worker (same --worker_hosts, "
            "its own --task_index), or raise startup_timeout_secs.")

    recovery.wait_for_answers(lambda: replica_watch.unreachable_workers(cluster),
                              timeout_secs, error, poll_secs,
                              waiting_for=f"worker {cluster.replica_index}'s peers to start")


def agree_on_checkpoint(cluster, server, session_config, own_dir, timeout_secs,
                        chief_decides=False):
    """(the agreed global step, the prefix this worker restores); None: start afresh.

    The steps every worker has are exchanged in one all-gather; the chosen
    step is the newest the chief and every worker share, else the chief's
    newest (a worker without it restores nothing and is told so). With
    `chief_decides` (every input's position is in the variables the chief
    broadcasts: towerlib.global_batch_input) it is the chief's newest: a
    worker new to the job, or one whose folder is older, restores nothing and
    takes the chief's values, its input position included.
    """
    for path in checkpoints.remove_leftovers(own_dir):
        logger.info("Removed leftover of an interrupted save: %s", path)
    own = checkpoints.restorable_steps(own_dir)
    newest_first = sorted(own, reverse=True)[:_AGREEMENT_STEPS]
    row = np.full([_AGREEMENT_STEPS], -1, np.int64)
    row[:len(newest_first)] = newest_first
    workers = cluster.num_replicas
    with tf.Graph().as_default():
        with tf.device(f"{cluster.task_device}/device:CPU:0"):
            gathered = collective_ops.all_gather(
                tf.constant(row), workers, _AGREEMENT_GROUP_KEY, 1, "auto")
        config = copy.deepcopy(session_config)
        config.operation_timeout_in_ms = int(timeout_secs * 1000)
        with tf.compat.v1.Session(server.target, config=config) as session:
            rows = session.run(gathered).reshape([workers, _AGREEMENT_STEPS])
    step = choose_resume_step([[int(s) for s in r if s >= 0] for r in rows],
                              chief_decides)
    return step, _own_prefix(step, own, own_dir, cluster, chief_decides)


def _own_prefix(step, own, own_dir, cluster, chief_decides):
    """This worker's checkpoint of the agreed `step` (None: it restores nothing)."""
    if step is None:
        return None
    if step not in own and chief_decides:
        logger.info("Worker %d has no checkpoint of global step %d in %s: it takes the "
                    "chief's values, its input position included.", cluster.replica_index,
                    step, own_dir)
        return None
    if step not in own:
        logger.warning("Worker %d has no checkpoint of global step %d in %s: it takes "
                       "the chief's weights but starts its input from the beginning.",
                       cluster.replica_index, step, own_dir)
        return None
    return own[step]


def choose_resume_step(steps_per_worker, chief_decides=False):
    """The global step every worker resumes from, or None to start afresh.

    `steps_per_worker[r]` lists worker r's complete checkpoints (the chief's
    first). The newest step all of them have keeps every worker's input
    position; without one, the chief's newest keeps the weights at least.
    With `chief_decides` (the chief's broadcast carries every worker's input
    position), the chief's newest, whatever the others hold.

        choose_resume_step([[10, 20], [10, 20]])   # 20
        choose_resume_step([[10, 20], [10]])       # 10: worker 1 lost step 20
        choose_resume_step([[10, 20], []])         # 20: worker 1 starts its data over
        choose_resume_step([[10, 20], [10]], chief_decides=True)   # 20
    """
    if chief_decides:
        return max(steps_per_worker[0], default=None)
    common = set(steps_per_worker[0]).intersection(*map(set, steps_per_worker[1:]))
    if common:
        return max(common)
    return max(steps_per_worker[0], default=None)


class _StartFromChief(tf.compat.v1.train.SessionRunHook):
    """Once each session is ready, before the first step: the slots sharded over the
    workers refilled from the chief's checkpoint (when it resumed), the chief's
    broadcast, then the inputs whose position the broadcast set restarted."""

    def __init__(self, broadcast_op, slot_fill=None, chief_prefix=""):
        self._broadcast_op = broadcast_op
        self._slot_fill = slot_fill    # (op, prefix placeholder) when the chief resumed
        self._chief_prefix = chief_prefix or ""
        self._input_initializers = []

    def begin(self):
        self._input_initializers = tf.compat.v1.get_collection(
            inputs_lib.INPUT_INITIALIZERS)

    def after_create_session(self, session, coord):
        del coord
        if self._slot_fill is not None:   # the owners' slots from the chief's checkpoint
            fill, prefix = self._slot_fill
            session.run(fill, {prefix: self._chief_prefix})
        if self._broadcast_op is not None:  # None: a job of one worker
            session.run(self._broadcast_op)
            if self._input_initializers:
                session.run(self._input_initializers)


class _OneSessionOnly(tf.compat.v1.train.SessionCreator):
    """No second session: after a collective failed, TensorFlow's abort is permanent."""

    def __init__(self, creator, cluster, chief_decides):
        self._creator = creator
        self._cluster = cluster
        self._chief_decides = chief_decides
        self._created = False

    def create_session(self):
        if self._created:
            raise WorkerLostError(_lost_message(self._cluster, None, "its step failed",
                                                self._chief_decides))
        self._created = True
        return self._creator.create_session()


def _gone_workers(cluster, settle_secs=3.0, poll_secs=0.25):
    """The workers refusing connections, polled for a few seconds while there is none.

    A collective fails the moment a peer's connection drops, which can be before
    that peer's port is closed (a killed process is still exiting): naming it
    then needs a short wait, not a single look.
    """
    deadline = time.monotonic() + settle_secs
    while True:
        gone = replica_watch.unreachable_workers(cluster)
        if gone or time.monotonic() >= deadline:
            return gone
        time.sleep(poll_secs)


def _mean_over_workers(cluster):
    """metric -> its mean over the workers, one all-reduce: the value every worker
    decides early stopping on (towerlib.Evaluation), bit-identical on all of them."""
    def agree(metric):
        with tf.device(f"{cluster.task_device}/device:CPU:0"), \
                tf.name_scope("evaluation_agreement"):
            total = collective_ops.all_reduce(
                tf.reshape(tf.cast(metric, tf.float64), [1]), cluster.num_replicas,
                _EVALUATION_GROUP_KEY, 1, "auto")
            return total[0] / cluster.num_replicas
    return agree


def _lost_message(cluster, deadline_secs, what, chief_decides=False):
    gone = _gone_workers(cluster)
    if gone:
        cause = ", ".join(f"{task} ({address})" for task, address in gone.items()) + (
            " no longer accepts connections" if len(gone) == 1 else
            " no longer accept connections")
    elif deadline_secs is not None:
        cause = (f"nothing came back within {deadline_secs:.0f} s though every worker "
                 "accepts connections: one is stopped (SIGSTOP), hung or slower than "
                 "the deadline")
    else:
        cause = "a worker left the collective group"
    resume = ("the chief's newest checkpoint" if chief_decides else
              "the newest checkpoint all of them have")
    return (f"Worker {cluster.replica_index}: {what}: {cause}. TensorFlow's collectives "
            "cannot go on in this process. Fix: restart every worker with the same "
            f"command; they resume from {resume} "
            "(raise step_deadline_secs if steps are this slow).")


def _start_from_chief(graph, step, restore_from, scaffold):
    """The hook that starts every worker from the chief's values; with the slots
    sharded over the workers, the run's Saver saving them whole, and their refill
    from the chief's checkpoint when the agreed `step` is not None."""
    tf_graph = graph.train_graph.train_op.graph
    slot_fill = slot_shards.fill_of(tf_graph)
    if slot_fill is not None:
        slot_shards.install_whole_saver(tf_graph, scaffold)
        if restore_from is not None:   # every worker's checkpoint holds every slot
            slot_shards.check_holds_every_slot(tf_graph, restore_from)
    return _StartFromChief(graph.train_graph.broadcast_op,
                           slot_fill if step is not None else None,
                           restore_from if graph.cluster.is_chief else "")


def _positions_broadcast(train_graph):
    """Whether every input of the step keeps its position in (broadcast) variables."""
    graph = train_graph.train_op.graph
    return bool(global_batches.inputs_of(graph)) and not data_position.unsaved_iterators(
        train_graph.train_op) and not graph.get_collection(
            tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)


def run_allreduce_training(graph, server, *, train_dir, max_steps, hooks=(),
                           startup_timeout_secs=600.0,
                           step_deadline_secs=replica_watch.DEFAULT_STEP_DEADLINE_SECS,
                           **run_kwargs):
    """Runs this worker's part of an all-reduce job until global_step reaches max_steps.

    Args:
      graph: from build_allreduce_train_graph.
      server: this task's server (start_server).
      train_dir: the chief's folder; worker r checkpoints into train_dir/worker_r.
      max_steps, hooks, **run_kwargs: as for towerlib.run_training (summaries
        and traces are written by the chief only).
      startup_timeout_secs: how long to wait for every worker to start and
        to agree on the checkpoint.
      step_deadline_secs: the bound on any run, the first step included.
        Checkpoints are saved every save_checkpoint_steps (not seconds: every
        worker must save at the same steps).
        A stop signal (SIGTERM) reaches the workers at different steps: one
        stops while another waits for it, which ends in WorkerLostError; the
        restart resumes from the newest step all have.

    Raises:
      WorkerLostError: a worker did not start, or was lost during training.
    """
    cluster = graph.cluster
    if run_kwargs.get("save_checkpoint_secs"):
        raise ValueError(
            "save_checkpoint_secs saves each worker at different steps, and a restart "
            "needs a step every worker saved. Fix: save_checkpoint_steps across workers.")
    wait_for_workers(cluster, startup_timeout_secs)
    chief_decides = _positions_broadcast(graph.train_graph)
    if graph.step_description is not None:
        # The loop's options too: a worker with another max_steps (or evaluation) would
        # leave the others waiting at a step it never runs.
        description = dict(graph.step_description, **agreement.describe_loop(
            max_steps, run_kwargs, saves_together=bool(
                slot_shards.saveables_of(graph.train_graph.train_op.graph))))
        try:  # before anything is restored or exchanged: one line, every worker
            agreement.check_workers_agree(cluster, server, graph.session_config,
                                          description, startup_timeout_secs)
        except _LOST_PEER_ERRORS:
            raise WorkerLostError(_lost_message(
                cluster, startup_timeout_secs, "the workers could not compare their "
                "steps", chief_decides)) from None
    own_dir = worker_train_dir(train_dir, cluster)
    tf.io.gfile.makedirs(own_dir)
    try:
        step, restore_from = agree_on_checkpoint(
            cluster, server, graph.session_config, own_dir, startup_timeout_secs,
            chief_decides=chief_decides)
    except _LOST_PEER_ERRORS:
        raise WorkerLostError(_lost_message(
            cluster, startup_timeout_secs, "the workers could not agree on a checkpoint "
            "to resume from", chief_decides)) from None
    if run_kwargs.get("evaluation") is not None and cluster.num_replicas > 1:
        run_kwargs["evaluation"] = run_kwargs["evaluation"].with_agreement(
            _mean_over_workers(cluster))
    config = copy.deepcopy(graph.session_config)
    config.operation_timeout_in_ms = int(step_deadline_secs * 1000)
    if not cluster.is_chief:
        run_kwargs.update(save_summaries_steps=None, trace_steps=())
    deadline = replica_watch.StepDeadlineHook(step_deadline_secs)
    start = _start_from_chief(graph, step, restore_from, run_kwargs.get("scaffold"))
    all_hooks = [start, *graph.hooks, *hooks, deadline]
    try:
        return trainer_lib.run_training(
            graph.train_graph, train_dir=own_dir, max_steps=max_steps, hooks=all_hooks,
            session_config=config, master=server.target, is_chief=True,
            restore_from=restore_from,
            session_creator_wrapper=lambda creator: _OneSessionOnly(creator, cluster,
                                                                    chief_decides),
            **run_kwargs)
    except _LOST_PEER_ERRORS:
        raise WorkerLostError(_lost_message(
            cluster, step_deadline_secs, f"its run {deadline.runs} could not complete",
            chief_decides)) from None
