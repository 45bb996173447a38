"""Where a cluster's ops run: servers, session configs, tower devices, ps placement.

Variables go to the ps tasks (spread by byte size), everything else to the
replica's own task, whose towers are its local devices under its task prefix.
"""

import tensorflow as tf

from towerlib.cluster.spec import PS_JOB, check_cluster
from towerlib.internals import error_texts
from towerlib.step import devices as devices_lib


class AddressError(RuntimeError):
    """This task's server cannot listen on its address."""


def session_config(cluster, num_towers=1, base_config=None):
    """The ConfigProto for this task's server and sessions.

    A replica gets towerlib.session_config(num_towers) (virtual CPU devices
    for CPU towers) and device_filters that let it talk only to the ps tasks
    and itself: replicas never exchange tensors directly, and a replica that
    is down must not stall the others' session creation. Without ps tasks
    the replicas all-reduce: collectives reach the other workers whatever
    the filters, and the chief's task leads the collective groups.
    """
    if cluster.is_ps:
        config = tf.compat.v1.ConfigProto()
        if base_config is not None:
            config.CopyFrom(base_config)
        config.device_filters[:] = [cluster.task_device]
        return config
    config = devices_lib.session_config(num_towers, base_config=base_config)
    if cluster.num_ps == 0:
        # All-reduce: the chief's task forms the collective groups (without
        # it the first collective waits forever); sessions need only this task.
        config.experimental.collective_group_leader = cluster.collective_leader
        config.device_filters[:] = [cluster.task_device]
        return config
    config.device_filters[:] = [f"/job:{PS_JOB}", cluster.task_device]
    return config


def start_server(cluster, num_towers=1, base_config=None):
    """Starts this task's gRPC server (tf.distribute.Server).

    The server, not the session, owns the task's devices, so a replica's
    virtual CPU devices for CPU towers are asked for here.
    """
    check_cluster(cluster, "start_server")
    try:
        return tf.distribute.Server(
            cluster.cluster_spec, job_name=cluster.job_name, task_index=cluster.task_index,
            config=session_config(cluster, num_towers, base_config), protocol="grpc",
            start=True)
    except tf.errors.OpError as error:
        if not error_texts.is_port_taken(error.message):
            raise
        address = cluster.jobs[cluster.job_name][cluster.task_index]
        raise AddressError(
            f"{cluster.job_name} task {cluster.task_index} cannot listen on {address}: "
            "another process holds the port, or the host is not this machine. Fix: stop "
            "that process or give this task a free port (--worker_hosts/--ps_hosts or "
            "TF_CONFIG), the same on every task.") from None


def tower_devices(cluster, num_towers=None, device_type=None):
    """This replica's tower devices: ['/job:worker/task:1/device:CPU:0', ...].

    Same arguments as towerlib.tower_devices, which looks at this machine.
    """
    task = tf.DeviceSpec.from_string(cluster.task_device)
    return [task.make_merged_spec(tf.DeviceSpec.from_string(local)).to_string()
            for local in devices_lib.tower_devices(num_towers, device_type)]


class ParameterServerPlacer:
    """Device function: variables to the ps tasks by byte size, the rest here.

    Each new variable goes to the ps task holding the fewest bytes so far, so
    one large dense layer does not share a task with everything else. Every
    other op goes to this replica's task (merged with what the op asked for).
    A variable that already names a job keeps it: an inner tf.device wins, and
    a second pass of this function (towerlib's tower scope calls it, then the
    enclosing scope does) changes nothing and counts nothing twice.

    Optimizer slots follow their variable (TF colocates them), so they are
    not counted; they grow every task's load in proportion.
    """

    def __init__(self, cluster):
        if cluster.num_ps < 1:
            raise ValueError(
                "This cluster has no ps task, so there is no parameter server to place "
                "variables on. Fix: give the ps addresses (--ps_hosts), or train with "
                "all-reduce across the workers: update=towerlib.Replicated().")
        self.ps_devices = cluster.ps_devices
        self._ps_placer = devices_lib.GreedyVariablePlacer(self.ps_devices)
        self.replica_device = tf.DeviceSpec.from_string(cluster.task_device)

    def __call__(self, op):
        requested = tf.DeviceSpec.from_string(op.device or "")
        if op.type in devices_lib.VARIABLE_OP_TYPES:
            if requested.job:
                return requested.to_string()
            return self._ps_placer(op)
        return self.replica_device.make_merged_spec(requested).to_string()

    @property
    def bytes_per_task(self):
        """Bytes of variables placed so far on each ps task."""
        return list(self._ps_placer.bytes_per_device)
