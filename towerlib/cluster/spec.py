"""Which cluster a process belongs to and which task it is.

A cluster has replica tasks ('worker', plus an optional 'chief' job from
TF_CONFIG), which train, and for the parameter-server path ps tasks, which
hold the variables (without ps tasks the replicas all-reduce). `ClusterInfo` describes it; `cluster_from_flags`,
`cluster_from_tf_config` and `resolve_cluster` build one and say what is
wrong with a description that cannot work.

Library code reads no flags: scripts pass flag values to `resolve_cluster`, which
falls back to the TF_CONFIG environment variable, then to Slurm's.
"""

import dataclasses
import json
import numbers
import os
import re
from typing import Dict, Tuple

import tensorflow as tf

from towerlib.cluster import slurm
from towerlib.exchange.group import WorkerGroup

PS_JOB = "ps"
WORKER_JOB = "worker"
CHIEF_JOB = "chief"
KNOWN_JOBS = (PS_JOB, WORKER_JOB, CHIEF_JOB)
# A host name or IPv4 address, or an IPv6 address in brackets.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")
# Names of this machine's loopback: TensorFlow's server listens on every interface,
# so one port under two of these spellings is one port.
_LOOPBACK = ("localhost", "ip6-localhost", "::1", "[::1]", "0.0.0.0")


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """Which cluster this process belongs to and which task it is.

    Attributes:
      jobs: job name -> tuple of 'host:port' addresses, e.g.
        {'ps': ('127.0.0.1:2222',), 'worker': ('127.0.0.1:2223', ...)}.
        Jobs are 'ps', 'worker' and optionally 'chief' (TF_CONFIG style).
      job_name: this task's job.
      task_index: this task's index within its job.
    """

    jobs: Dict[str, Tuple[str, ...]]
    job_name: str
    task_index: int

    @property
    def cluster_spec(self):
        """The tf.train.ClusterSpec of the whole cluster."""
        return tf.train.ClusterSpec({job: list(hosts) for job, hosts in self.jobs.items()})

    @property
    def num_ps(self):
        return len(self.jobs.get(PS_JOB, ()))

    @property
    def replica_jobs(self):
        """The jobs whose tasks train: ('chief', 'worker') or ('worker',)."""
        return tuple(job for job in (CHIEF_JOB, WORKER_JOB) if self.jobs.get(job))

    @property
    def num_replicas(self):
        """R: how many tasks train, each on its own share of the global batch."""
        return sum(len(self.jobs[job]) for job in self.replica_jobs)

    @property
    def is_ps(self):
        return self.job_name == PS_JOB

    @property
    def is_chief(self):
        """The chief initializes, checkpoints and writes summaries.

        It is the 'chief' task when there is one, else worker 0.
        """
        if CHIEF_JOB in self.jobs and self.jobs[CHIEF_JOB]:
            return self.job_name == CHIEF_JOB
        return self.job_name == WORKER_JOB and self.task_index == 0

    @property
    def replica_index(self):
        """0..R-1 over the training tasks (chief first): which data shard is ours."""
        if self.is_ps:
            raise ValueError("A ps task is not a replica: it holds variables, "
                             "it does not train.")
        if self.job_name == CHIEF_JOB:
            return 0
        return self.task_index + len(self.jobs.get(CHIEF_JOB, ()))

    @property
    def task_device(self):
        """'/job:worker/task:1': the device prefix of this task's ops."""
        return f"/job:{self.job_name}/task:{self.task_index}"

    @property
    def worker_group(self):
        """This replica among all of them, for an exchange that spans the workers."""
        return WorkerGroup(num_workers=self.num_replicas, worker_index=self.replica_index)

    @property
    def collective_leader(self):
        """The task that forms the collective groups: the chief's."""
        job = CHIEF_JOB if self.jobs.get(CHIEF_JOB) else WORKER_JOB
        return f"/job:{job}/replica:0/task:0"

    def replica_address(self, replica_index):
        """('job task i', 'host:port') of replica `replica_index` (chief first)."""
        tasks = [(job, index, address) for job in self.replica_jobs
                 for index, address in enumerate(self.jobs[job])]
        job, index, address = tasks[replica_index]
        return f"{job} task {index}", address

    @property
    def ps_devices(self):
        return [f"/job:{PS_JOB}/task:{i}/device:CPU:0" for i in range(self.num_ps)]


def check_cluster(cluster, where):
    """Raises TypeError unless `cluster` is a ClusterInfo (None: one machine, refused)."""
    if not isinstance(cluster, ClusterInfo):
        got = "None (one machine)" if cluster is None else type(cluster).__name__
        raise TypeError(
            f"{where} takes this task's ClusterInfo, got {got}. Fix: "
            "cluster = towerlib.cluster.resolve_cluster(...) (flags, TF_CONFIG or Slurm); "
            "on one machine use towerlib.build_train_graph and run_training.")


def parse_host_list(text, what):
    """'h1:p1,h2:p2' -> ('h1:p1', 'h2:p2'), each address validated.

    Args:
      text: comma-separated addresses; a list or tuple is accepted too, and
        TensorFlow's sparse form {task index: address} when it lists every
        task 0..n-1.
      what: where the list came from, for error messages ('--ps_hosts').
    """
    if isinstance(text, dict):
        items = _sparse_items(text, what)
    elif isinstance(text, (list, tuple)):
        items = [str(item).strip() for item in text]
    else:
        items = [item.strip() for item in str(text or "").split(",")]
        if items == [""]:
            return ()
    for address in items:
        _check_address(address, what)
    return tuple(items)


def _sparse_items(tasks, what):
    """{0: 'h:p', '1': 'h:p'} -> ['h:p', 'h:p']; indices missing or not ints refused."""
    indices = {}
    for key, address in tasks.items():
        text = str(key)
        if isinstance(key, bool) or not text.isdigit():
            indices = None
            break
        indices[int(text)] = str(address).strip()
    if indices is None or sorted(indices) != list(range(len(indices))):
        raise ValueError(
            f"{what}: the sparse form {{task index: address}} with the indices "
            f"{sorted(tasks, key=str)} lists not every task 0..n-1, which towerlib needs. "
            f"Fix: list every task's address in order, e.g. {what}=[\"h:p\", \"h:p\"].")
    return [indices[i] for i in range(len(indices))]


def _check_address(address, what):
    scheme, has_scheme, rest = address.partition("://")
    if has_scheme:
        raise ValueError(
            f"{what}: {address!r} has the scheme {scheme + '://'!r}; cluster addresses are "
            f"plain 'host:port' (the servers speak gRPC). Fix: {rest!r}.")
    host, sep, port = address.rpartition(":")
    if not address or not sep or not host:
        raise ValueError(
            f"{what}: {address!r} is not a 'host:port' address. Write e.g. "
            f"{what}=127.0.0.1:2222,127.0.0.1:2223 (no spaces inside an address, "
            "no empty entries).")
    if not _HOST.match(host):
        raise ValueError(
            f"{what}: {address!r} has the host {host!r}, which is no host name or IP "
            "address (letters, digits, '.', '-', '_'; an IPv6 address in brackets).")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"{what}: {address!r} has port {port!r}; a port is an integer in "
            "1..65535.")


def _machine_port(address):
    """(host, port) with the host lower-cased and every loopback spelling made one."""
    host, _, port = address.rpartition(":")
    host = host.lower()
    if host in _LOOPBACK or host.startswith("127."):
        host = "loopback"
    return host, int(port)


def _validated(jobs, job_name, task_index, source):
    """A ClusterInfo after checking that the description is usable."""
    unknown = sorted(set(jobs) - set(KNOWN_JOBS))
    if unknown:
        raise ValueError(
            f"{source}: unknown job(s) {unknown}. towerlib knows 'ps' (variables), "
            "'worker' and 'chief' (training replicas).")
    jobs = {job: hosts for job, hosts in jobs.items() if hosts}
    if not jobs.get(WORKER_JOB) and not jobs.get(CHIEF_JOB):
        raise ValueError(
            f"{source}: the cluster has no 'worker' task. Give at least one worker "
            "address (--worker_hosts).")
    if len(jobs.get(CHIEF_JOB, ())) > 1:
        raise ValueError(
            f"{source}: the 'chief' job has {len(jobs[CHIEF_JOB])} tasks; it has "
            "exactly one (the other training tasks belong in 'worker').")
    _check_ports_unique(jobs, source)
    if job_name not in jobs:
        raise ValueError(
            f"{source}: this task's job {job_name!r} is not in the cluster "
            f"(jobs: {sorted(jobs)}). Use --job_name=ps or --job_name=worker.")
    if isinstance(task_index, bool) or not isinstance(task_index, numbers.Integral):
        raise TypeError(f"{source}: task index must be an int, got {task_index!r}.")
    if not 0 <= task_index < len(jobs[job_name]):
        raise ValueError(
            f"{source}: task index {task_index} is out of range for job "
            f"{job_name!r}, which has {len(jobs[job_name])} task(s) "
            f"(valid: 0..{len(jobs[job_name]) - 1}).")
    return ClusterInfo(jobs=dict(jobs), job_name=job_name, task_index=task_index)


def _check_ports_unique(jobs, source):
    """Refuses two tasks on one port of one machine, also under two spellings."""
    seen = {}
    for job, hosts in jobs.items():
        for index, address in enumerate(hosts):
            key = _machine_port(address)
            if key in seen:
                other, task = seen[key]
                spelled = "" if other == address else (
                    f" (as {other}: one port of this machine under two spellings)")
                raise ValueError(
                    f"{source}: address {address} is given to both {task} and "
                    f"{job}:{index}{spelled}; every task needs its own port.")
            seen[key] = (address, f"{job}:{index}")


def cluster_from_flags(ps_hosts="", worker_hosts="", job_name="", task_index=0):
    """The cluster from --ps_hosts/--worker_hosts/--job_name/--task_index values.

    Worker 0 is the chief. Returns None when all of ps_hosts, worker_hosts and
    job_name are empty (a one-machine run). Without ps_hosts the workers
    train with all-reduce (towerlib.cluster.allreduce_job).

    Raises:
      ValueError: naming the flag that is missing or malformed.
    """
    ps = parse_host_list(ps_hosts, "--ps_hosts")
    workers = parse_host_list(worker_hosts, "--worker_hosts")
    if not ps and not workers and not job_name:
        return None
    missing = [name for name, value in (("--worker_hosts", workers),
                                        ("--job_name", job_name)) if not value]
    if missing:
        raise ValueError(
            f"Distributed training needs --worker_hosts and --job_name (and "
            f"--ps_hosts for parameter servers); missing: {', '.join(missing)}. Leave "
            "all of them empty to train on one machine.")
    if job_name not in (PS_JOB, WORKER_JOB):
        raise ValueError(
            f"--job_name={job_name!r}: use 'ps' or 'worker' (worker 0 is the chief).")
    return _validated({PS_JOB: ps, WORKER_JOB: workers}, job_name, task_index,
                      "cluster flags")


def cluster_from_tf_config(tf_config):
    """The cluster from a TF_CONFIG value (a JSON string or an already parsed dict).

    TF_CONFIG looks like
      {"cluster": {"ps": ["h:p"], "worker": ["h:p", "h:p"], "chief": ["h:p"]},
       "task": {"type": "worker", "index": 0}}
    ("chief" is optional; without it worker 0 is the chief). A job may also be
    TensorFlow's sparse form {"0": "h:p", "1": "h:p"} of every task; "rpc_layer"
    may be "grpc" (the only one). Returns None for an empty value or one
    without a "cluster".
    """
    if not tf_config:
        return None
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG is not valid JSON ({error}): "
                             f"{tf_config[:200]!r}") from error
    if not isinstance(tf_config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object, got {type(tf_config).__name__}.")
    rpc_layer = tf_config.get("rpc_layer")
    if rpc_layer not in (None, "", "grpc"):
        raise ValueError(
            f"TF_CONFIG rpc_layer={rpc_layer!r}: towerlib's servers speak gRPC only. Fix: "
            '"rpc_layer": "grpc", or leave it out.')
    cluster = tf_config.get("cluster")
    if not cluster:
        if tf_config.get("task"):
            raise ValueError(
                'TF_CONFIG has a "task" but no "cluster": this process would train '
                'alone. Fix: add "cluster": {"worker": ["host:port", ...]}, or unset '
                "TF_CONFIG to train on one machine.")
        return None
    if not isinstance(cluster, dict):
        raise ValueError('TF_CONFIG "cluster" must map job names to address lists.')
    task = tf_config.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ValueError(
            'TF_CONFIG has a "cluster" but no "task": add '
            '"task": {"type": "worker", "index": 0} for this process.')
    if task["type"] == "evaluator":
        raise ValueError(
            "TF_CONFIG task type 'evaluator' does not train; run evaluation as a "
            "separate one-machine job on the checkpoints in train_dir.")
    jobs = {job: parse_host_list(hosts, f"TF_CONFIG cluster.{job}")
            for job, hosts in cluster.items()}
    return _validated(jobs, task["type"], task.get("index", 0), "TF_CONFIG")


def resolve_cluster(ps_hosts="", worker_hosts="", job_name="", task_index=0,
                    environ=None):
    """The cluster this process belongs to; None on one machine.

    Read in this order, the first that describes a cluster wins:
      1. the flag values (--ps_hosts, --worker_hosts, --job_name, --task_index);
      2. TF_CONFIG (Kubeflow's TFJob, Ray Train, towerlib.launch write it);
      3. a Slurm job step (srun's SLURM_* variables, through TensorFlow's
         SlurmClusterResolver: one task per worker; towerlib.cluster.slurm).

    Args:
      ps_hosts, worker_hosts, job_name, task_index: the flag values.
      environ: the environment to read TF_CONFIG and Slurm's variables from
        (default os.environ; TensorFlow's resolver is shown environ's Slurm
        variables while it runs).

    Raises:
      ValueError: when both the flags and TF_CONFIG describe a cluster (which
        one is meant would be a guess), or the description that wins is
        malformed (the message names the flag or variable).
    """
    environ = os.environ if environ is None else environ
    from_flags = cluster_from_flags(ps_hosts, worker_hosts, job_name, task_index)
    from_env = cluster_from_tf_config(environ.get("TF_CONFIG", ""))
    if from_flags is not None and from_env is not None:
        raise ValueError(
            "Both the cluster flags and TF_CONFIG describe a cluster. Use one: "
            "unset TF_CONFIG, or leave --ps_hosts/--worker_hosts/--job_name empty.")
    if from_flags is not None or from_env is not None:
        return from_flags if from_flags is not None else from_env
    if slurm.in_slurm_step(environ):
        return _validated(*slurm.cluster_from_slurm(environ), "Slurm")
    return None
