"""Which transport an exchange uses, and the arguments each transport accepts.

One place for the rules CrossTowerReducer and the `exchange=` option share:
collectives (NCCL) when every tower is a GPU, graph edges otherwise.

    default_transport(["/device:GPU:0", "/device:GPU:1"])   # 'collective'
    default_transport(["/device:CPU:0", "/device:CPU:1"])   # 'graph'
"""

import tensorflow as tf

__all__ = ["TRANSPORTS", "all_gpus", "check_reducer_options", "default_transport",
           "hubs_per_worker"]

TRANSPORTS = ("collective", "graph")


def all_gpus(devices) -> bool:
    """Whether every device string names a GPU."""
    return {tf.DeviceSpec.from_string(d).device_type for d in devices} == {"GPU"}


def default_transport(devices) -> str:
    return "collective" if all_gpus(devices) else "graph"


def hubs_per_worker(devices, workers, communication_hint) -> bool:
    """Whether collectives across workers go between per-worker graph hubs
    (towerlib.exchange.worker_hubs): several towers per worker, not all of them GPUs,
    off NCCL."""
    return (workers.spans_workers and len(devices) > 1 and not all_gpus(devices)
            and communication_hint != "nccl")


def check_reducer_options(devices, group_key, timeout_seconds, communication_hint,
                          transport, spans_workers=False):
    """(transport, communication_hint) for a reducer over `devices`, checked.

    An exchange that spans several workers' towers (`spans_workers`) goes
    through collectives: a graph edge cannot leave the worker's own graph.

    Raises:
      ValueError: devices repeated, a bad timeout, transport or hint, a group
        key without collectives, or NCCL with a CPU tower.
    """
    if not devices:
        raise ValueError("CrossTowerReducer needs at least one device; got none.")
    canonical = [tf.DeviceSpec.from_string(d).to_string() for d in devices]
    if len(set(canonical)) != len(canonical):
        raise ValueError(
            f"CrossTowerReducer devices must be distinct (one per tower), got "
            f"{devices}: a collective needs each member on its own device.")
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise ValueError(
            f"timeout_seconds must be None (no per-op timeout) or a positive "
            f"number of seconds, got {timeout_seconds!r}.")
    gpus_only = all_gpus(devices)
    if transport is None:
        transport = "collective" if spans_workers else default_transport(devices)
    if spans_workers and transport != "collective":
        raise ValueError(
            f"transport={transport!r} cannot span several workers: a graph edge "
            "stays inside one worker's graph. Fix: the 'collective' transport "
            "(towerlib.CollectiveExchange()), or None to choose it.")
    if transport not in TRANSPORTS:
        raise ValueError(
            f"transport must be one of {TRANSPORTS} (or None to choose by "
            f"device type), got {transport!r}.")
    if group_key is not None and transport != "collective":
        raise ValueError(
            "group_key is a collective group key, and this reducer uses the "
            f"{transport!r} transport; pass transport='collective' with it.")
    if communication_hint is None:
        communication_hint = "nccl" if gpus_only else "auto"
    if communication_hint not in ("auto", "ring", "nccl"):
        raise ValueError(
            f"communication_hint must be 'auto', 'ring' or 'nccl', got {communication_hint!r}.")
    if communication_hint == "nccl" and not gpus_only and transport == "collective":
        raise ValueError(
            f"communication_hint='nccl' needs every tower on a GPU, got {devices}: "
            "NCCL cannot join a CPU. Put every tower on a GPU, or pass "
            "communication_hint='ring' (or None to choose by device type).")
    return transport, communication_hint
