"""Training one model on several machines, synchronously, over TensorFlow's gRPC runtime.

Parameter-server tasks ('ps') hold the variables; every other task is a
replica ('worker', or 'chief' from TF_CONFIG) that runs its towers as on one
machine. Each global step the chief applies the mean of the R replicas'
gradients once: the step one machine would take with every tower
(docs/distributed.md). Which task a process is:

    >>> from towerlib import cluster as cluster_lib
    >>> cluster = cluster_lib.cluster_from_flags(
    ...     ps_hosts="127.0.0.1:2222", worker_hosts="127.0.0.1:2223,127.0.0.1:2224",
    ...     job_name="worker", task_index=1)
    >>> cluster.num_replicas, cluster.replica_index, cluster.is_chief
    (2, 1, False)

Then a ps task runs `run_parameter_server(cluster)`, which returns once every
replica is done, and each replica runs

    server = cluster_lib.start_server(cluster, num_towers)
    placer = cluster_lib.ParameterServerPlacer(cluster)
    with tf.compat.v1.device(placer):
        inputs = my_input(shard=cluster.replica_index, num_shards=cluster.num_replicas)
    sync_graph = cluster_lib.build_sync_train_graph(
        model, inputs, optimizer, cluster, num_towers=num_towers, device_function=placer)
    cluster_lib.run_distributed_training(sync_graph, server, train_dir=..., max_steps=...)

Without ps tasks, `build_sync_train_graph(..., update=towerlib.Replicated())`
trains by all-reduce across the workers instead (`allreduce`), and
`run_distributed_training` runs it.

Modules: `spec` says which cluster and which task, `allreduce_job` the
all-reduce path, `placement` where ops and
variables go, `ps_step` builds the ps path's synchronous step, `runtime` runs it
to a clean end on every task, `recovery` bounds the wait for a lost ps task,
`replica_watch` the wait for a lost worker.
"""

from typing import TYPE_CHECKING

from towerlib.lazy_names import lazy_loader

# The public names, each imported on first use (towerlib's __init__ says how): so
# `from towerlib.cluster.exits import RETRYABLE` (towerlib-launch) needs no TensorFlow.
if TYPE_CHECKING:
    from towerlib.cluster.allreduce_job import (
        AllReduceTrainGraph,
        WorkerLostError,
        build_allreduce_train_graph,
        run_allreduce_training,
        worker_train_dir,
    )
    from towerlib.cluster.exits import (
        RESTART_STATUSES,
        RETRYABLE,
        USER_ERROR,
        exit_by_meaning,
        exit_status,
    )
    from towerlib.cluster.placement import (
        AddressError,
        ParameterServerPlacer,
        session_config,
        start_server,
        tower_devices,
    )
    from towerlib.cluster.ps_step import (
        SyncReplicasInitHook,
        SyncReplicasTowerOptimizer,
        SyncTrainGraph,
        build_sync_train_graph,
        check_bn_mode_for_cluster,
    )
    from towerlib.cluster.recovery import (
        DEFAULT_PS_RESTART_TIMEOUT_SECS,
        PsUnavailableError,
        RecoveringSessionCreator,
    )
    from towerlib.cluster.replica_watch import (
        DEFAULT_STEP_DEADLINE_SECS,
        ReplicaLostError,
        StepDeadlineHook,
    )
    from towerlib.cluster.runtime import (
        ControlSession,
        run_distributed_training,
        run_parameter_server,
        wait_for_ps_tasks,
    )
    from towerlib.cluster.spec import (
        CHIEF_JOB,
        KNOWN_JOBS,
        PS_JOB,
        WORKER_JOB,
        ClusterInfo,
        cluster_from_flags,
        cluster_from_tf_config,
        parse_host_list,
        resolve_cluster,
    )
    from towerlib.exchange.safety import PeerTimeoutError

__all__ = [
    # all-reduce across workers, without ps tasks
    "AllReduceTrainGraph", "WorkerLostError", "build_allreduce_train_graph",
    "run_allreduce_training", "worker_train_dir",
    # where ops and variables go
    "AddressError", "ParameterServerPlacer", "session_config", "start_server",
    "tower_devices",
    # a lost ps task
    "DEFAULT_PS_RESTART_TIMEOUT_SECS", "PsUnavailableError", "RecoveringSessionCreator",
    # a lost worker
    "DEFAULT_STEP_DEADLINE_SECS", "ReplicaLostError", "StepDeadlineHook",
    # running to a clean end on every task
    "ControlSession", "run_distributed_training", "run_parameter_server", "wait_for_ps_tasks",
    # exit statuses a scheduler reads; a wait on another task past its bound (138)
    "PeerTimeoutError", "RESTART_STATUSES", "RETRYABLE", "USER_ERROR", "exit_by_meaning", "exit_status",
    # which cluster and which task
    "CHIEF_JOB", "KNOWN_JOBS", "PS_JOB", "WORKER_JOB", "ClusterInfo", "cluster_from_flags",
    "cluster_from_tf_config", "parse_host_list", "resolve_cluster",
    # the synchronous step
    "SyncReplicasInitHook", "SyncReplicasTowerOptimizer", "SyncTrainGraph",
    "build_sync_train_graph", "check_bn_mode_for_cluster",
]

__getattr__ = lazy_loader(__name__, __file__)


def __dir__():
    return sorted(set(globals()) | set(__all__))
