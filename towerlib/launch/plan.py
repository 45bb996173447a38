"""Which tasks a job has, which of them this host runs, and each one's TF_CONFIG.

One machine: `workers` worker tasks (and `ps` ps tasks for the parameter-server
layout) at 127.0.0.1 on ports the launcher holds (launch.ports). Several
machines: the same command on every host, with the host list and this host's
index; each host runs `workers` workers, host h's worker i being worker
h * workers + i at hosts[h]:port_base + i (a host written 'name:port' uses
its own port base), so every host computes the same cluster without talking
to the others.

The cluster has the jobs towerlib.cluster.spec reads: 'worker' (worker 0 is the
chief: no 'chief' job is written) and 'ps' when there are ps tasks.
"""

import dataclasses
import json
import re

__all__ = ["JobPlan", "Task", "parse_task_list", "tf_config"]

WORKER = "worker"   # towerlib.cluster.spec's WORKER_JOB and PS_JOB, spelled here so
PS = "ps"           # that a plan needs no TensorFlow
DEFAULT_PORT_BASE = 2222
# Tasks one host may run: each is a process with its own server and, for
# towerlib's scripts, its own TensorFlow (hundreds of MB). Far more is a typo.
MAX_LOCAL_TASKS = 256
# A host name (letters, digits, '.', '-', '_') or an IPv6 literal in brackets.
_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


@dataclasses.dataclass(frozen=True, order=True)
class Task:
    """One process of the job: `job` ('worker' or 'ps') and its index in the job."""

    job: str
    index: int

    @property
    def name(self):
        """'worker 1': how output prefixes and messages name the task."""
        return f"{self.job} {self.index}"

    @property
    def key(self):
        """'worker:1': how --tasks names it."""
        return f"{self.job}:{self.index}"


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """The job's shape.

    Attributes:
      workers: worker tasks on each host (the whole job's on one machine).
      ps: ps tasks (one machine only).
      hosts: every host of a multi-host job, in the same order on each
        ('name', or 'name:port' for that host's own port base); () on one machine.
      host_index: which of `hosts` this is.
      port_base: a multi-host job's worker i on a host listens on port_base + i.
    """

    workers: int
    ps: int = 0
    hosts: tuple = ()
    host_index: int = 0
    port_base: int = DEFAULT_PORT_BASE

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"--workers {self.workers}: a job needs at least 1 worker.")
        if self.ps < 0:
            raise ValueError(f"--ps {self.ps}: the number of ps tasks is 0 or more.")
        if self.workers + self.ps > MAX_LOCAL_TASKS:
            raise ValueError(
                f"--workers {self.workers} --ps {self.ps}: {self.workers + self.ps} task "
                f"processes on one host; at most {MAX_LOCAL_TASKS}. Fix: fewer tasks (each "
                "uses every GPU or CPU device it is given), or spread them with --hosts.")
        if self.hosts and self.ps:
            raise ValueError("--ps with --hosts: the launcher runs ps tasks on one machine "
                             "only. Fix: drop --hosts, or all-reduce without --ps.")
        if self.hosts and not 0 <= self.host_index < len(self.hosts):
            raise ValueError(f"--host_index {self.host_index} is not an index of --hosts "
                             f"({len(self.hosts)} hosts: 0..{len(self.hosts) - 1}).")
        for _, base in self.host_addresses():
            if not 0 < base <= 65536 - self.workers:
                raise ValueError(f"port base {base} (--port_base or a host's :port): "
                                 f"ports base..base+{self.workers - 1} must lie in "
                                 "1..65535.")

    def host_addresses(self):
        """[(host name, its port base)] of a multi-host job, in --hosts order."""
        pairs = []
        for host in self.hosts:
            name, sep, port = host.rpartition(":")
            if not sep or "]" in port:   # no port (an IPv6 literal's colons aside)
                name, port = host, str(self.port_base)
            if not _HOST_NAME.fullmatch(name) or not port.isdigit():
                raise ValueError(f"--hosts: {host!r} is not 'name' or 'name:port' (a host "
                                 "name of letters, digits, '.', '-', '_', or [IPv6]).")
            pairs.append((name, int(port)))
        return pairs

    @property
    def multi_host(self):
        return bool(self.hosts)

    @property
    def num_workers(self):
        """Workers in the whole job."""
        return self.workers * max(len(self.hosts), 1)

    def local_tasks(self):
        """The tasks this host starts: workers first, then ps tasks."""
        first = self.host_index * self.workers if self.hosts else 0
        return ([Task(WORKER, first + i) for i in range(self.workers)]
                + [Task(PS, i) for i in range(self.ps)])

    def fixed_ports(self):
        """A multi-host job's ports on this host (no choice: the others must know them)."""
        base = self.host_addresses()[self.host_index][1]
        return [base + i for i in range(self.workers)]

    def cluster(self, ports=()):
        """{'worker': [...], 'ps': [...]}: the job's addresses.

        ports: one machine's chosen ports, one per local task, in
        local_tasks() order; ignored for a multi-host job.
        """
        if self.hosts:
            return {WORKER: [f"{name}:{base + i}" for name, base in self.host_addresses()
                             for i in range(self.workers)]}
        addresses = [f"127.0.0.1:{port}" for port in ports]
        jobs = {WORKER: addresses[:self.workers]}
        if self.ps:
            jobs[PS] = addresses[self.workers:self.workers + self.ps]
        return jobs


def tf_config(cluster, task):
    """The TF_CONFIG value (JSON) of `task` in `cluster`, as Kubeflow's TFJob writes it."""
    return json.dumps({"cluster": cluster, "task": {"type": task.job, "index": task.index}})


def parse_task_list(text, plan):
    """'worker:0,ps:0' -> {Task('worker', 0), Task('ps', 0)}; tasks the output shows.

    Raises:
      ValueError: an entry that is not 'job:index' or names no task this host runs.
    """
    local = {task.key: task for task in plan.local_tasks()}
    chosen = set()
    for entry in (item.strip() for item in text.split(",")):
        if entry not in local:
            raise ValueError(f"--tasks: {entry!r} is not a task this host runs; "
                             f"choose from {', '.join(local)}.")
        chosen.add(local[entry])
    return chosen
