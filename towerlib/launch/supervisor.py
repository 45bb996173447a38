"""Runs a job's tasks to the end, restarting every task when one fails retryably.

One attempt: hold ports, start every task this host runs with its TF_CONFIG,
watch them. It ends when
  - every worker exited 0 (the ps tasks then end on their own, as
    towerlib.cluster.run_parameter_server does; after ps_grace_secs they are
    stopped): the job is done;
  - a task exited non-zero (a ps task too): the first failure. Tasks seen
    ending in the same poll are ranked so that the cause is named rather than
    its echo (a peer's 138 after a SIGKILL);
  - the launcher got SIGINT, SIGTERM, SIGHUP or SIGUSR1: forwarded at once to
    every task (SIGHUP and SIGUSR1 as SIGTERM: a closed terminal is a stop, and
    Slurm's --signal=USR1@N a warning to save before the job is requeued; a task
    saves on SIGTERM); the launcher's status is 128 + the signal it got (129 for
    SIGHUP), but 143 for SIGUSR1, whose 138 means "a lost peer, restart".
Every attempt ends through children.stop_children (SIGTERM, a grace, SIGKILL
to every process of every task's session), whatever path it takes, exceptions
included; a reaper.Watchdog does the same if the launcher dies.

Then: a status in RESTART_STATUSES restarts every task on new ports, up to
max_restarts; an AddressError (a port taken despite the hold) retries on new
ports, up to port_retries; any other status ends the job with that status.

Elastic jobs (min_workers < the plan's workers, `--workers MIN:MAX`): a worker
that exited statuses.HOST_LOST (its host is gone) is not started again at the
next restart: the job restarts on the workers that remain, numbered 0..n-1 in
a new TF_CONFIG, as long as at least min_workers remain (else it ends with
HOST_LOST). Any other restart takes the plan's full count again (a lost host
may be back; if it is not, its task says so again). Each attempt's line and
the summary say how many workers it ran.
"""

import dataclasses
import os
import signal
import time

from towerlib.launch import children as children_lib
from towerlib.launch import plan as plan_lib
from towerlib.launch import ports as ports_lib
from towerlib.launch import reaper, statuses

__all__ = ["AS_SIGTERM", "Failure", "JobResult", "Launcher", "RESTART_VARIABLE", "stop_status"]

# Each task's environment says which restart it belongs to (0 for the first start).
RESTART_VARIABLE = "TOWERLIB_LAUNCH_RESTART"
# Signals to the launcher that reach the tasks as SIGTERM (they save on it): SIGHUP, a
# closed terminal; SIGUSR1, a scheduler's warning before a time limit or a preemption
# (Slurm's --signal=USR1@N), a request to save and be requeued.
AS_SIGTERM = (signal.SIGHUP, signal.SIGUSR1)


def stop_status(signum):
    """The launcher's status when stopped by `signum`: 128 + signum, but 143 (SIGTERM's)
    for SIGUSR1: its 138 would read as towerlib's 'a lost peer, restart every task'."""
    return 128 + (signal.SIGTERM if signum == signal.SIGUSR1 else signum)
_LINE_CHARS = 240


@dataclasses.dataclass(frozen=True)
class Failure:
    """The first failure of an attempt: which task, its status, its last line."""

    attempt: int
    task: plan_lib.Task
    status: int
    last_line: str
    workers: int = 0   # the attempt's worker count

    def describe(self):
        line = self.last_line if len(self.last_line) <= _LINE_CHARS else \
            self.last_line[:_LINE_CHARS] + "..."
        return (f"{self.task.name} exited {self.status} "
                f"({statuses.describe_status(self.status)}), its last line: {line!r}")


@dataclasses.dataclass
class JobResult:
    """How the job ended: the launcher's exit status and each attempt's first failure."""

    status: int = 0
    failures: list = dataclasses.field(default_factory=list)
    restarts: int = 0
    signal: int = 0
    notes: list = dataclasses.field(default_factory=list)
    elastic: bool = False   # then each attempt's worker count is said too
    workers: int = 0        # the last attempt's worker count

    def summary(self):
        """One line: each attempt's first failure, then the final status."""
        size = (lambda n: f" on {_workers(n)}") if self.elastic else (lambda n: "")
        parts = [f"attempt {f.attempt + 1}{size(f.workers)}: {f.describe()}"
                 for f in self.failures]
        parts += self.notes
        requeue = " (a requeue request: the tasks got SIGTERM)" \
            if self.signal == signal.SIGUSR1 else ""
        end = (f"stopped by {signal.Signals(self.signal).name}{requeue}" if self.signal else
               "done" if self.status == 0 else "failed") + size(self.workers)
        parts.append(f"{end}, status {self.status} after {self.restarts} restart(s)")
        return "summary: " + "; ".join(parts)


def _budget_spent(max_restarts):
    return (f"the restart budget ran out: --max_restarts {max_restarts} used up"
            if max_restarts else "no restart allowed: --max_restarts 0")


def _workers(count):
    return f"{count} worker{'s' if count != 1 else ''}"


class Launcher:
    """Starts, watches, restarts and always stops one job's tasks on this host.

    Args:
      command: the argv every task runs (e.g. ['python', 'train.py', '--x=1']).
      plan: a launch.plan.JobPlan.
      output: a launch.output.Output.
      max_restarts: restarts of the whole job after a retryable failure.
      min_workers: the fewest workers an elastic job restarts on after lost hosts
        (module text); None: the plan's count, a fixed-size job.
      stop_grace_secs: after SIGTERM, how long a task may take to exit before SIGKILL.
      ps_grace_secs: how long the ps tasks may take to end once the workers are done.
      port_retries: new-port retries after a task could not listen on its port.
      env: the tasks' base environment (default os.environ).
      hold_ports: count -> launch.ports.HeldPorts (tests give a taken port here).
      poll_secs: how often the tasks are looked at.
    """

    def __init__(self, command, plan, output, *, max_restarts=0, min_workers=None,
                 stop_grace_secs=10.0, ps_grace_secs=30.0, port_retries=3, env=None,
                 hold_ports=ports_lib.hold_free_ports, poll_secs=0.05):
        self.command, self.plan, self.output = list(command), plan, output
        self.min_workers = plan.workers if min_workers is None else min_workers
        if not 1 <= self.min_workers <= plan.workers:
            raise ValueError(f"min_workers {min_workers}: 1..{plan.workers} (the plan's).")
        if self.min_workers < plan.workers and (plan.ps or plan.multi_host):
            raise ValueError("elastic restarts: one machine, no ps tasks.")
        self.current = plan   # the running attempt's plan: its worker count
        self.max_restarts, self.port_retries = max_restarts, port_retries
        self.stop_grace_secs, self.ps_grace_secs = stop_grace_secs, ps_grace_secs
        self.env = dict(os.environ if env is None else env)
        self.hold_ports, self.poll_secs = hold_ports, poll_secs
        self.children = []
        self.signal = 0
        self._forwarded = {}   # pid: the claim of the one stop signal sent to it
        self.failed_at = None   # monotonic time of the newest failure seen
        self.watchdog = None
        self._since = 0   # ticks: when run() began (reaper.end_orphans)
        self._orphan_sessions = set()   # sessions of orphans the watchdog was told
        self._orphans_looked_at = 0.0

    def forward_signal(self, signum):
        """From a signal handler: stop the job, forwarding `signum` to every task
        (SIGHUP as SIGTERM). A second signal SIGKILLs every task at once."""
        if self.signal:
            for child in list(self.children):
                children_lib.signal_child(child, signal.SIGKILL)
            return
        self.signal = signum
        for child in list(self.children):
            self._forward_once(child)

    def _forward_once(self, child):
        """The first signal to `child`, sent once: by the handler, or by `_attempt`
        for a task that started before the handler ran but was listed after it."""
        claim = object()   # setdefault is one step: the handler cannot split it
        if self._forwarded.setdefault(child.pid, claim) is claim:
            children_lib.signal_child(
                child, signal.SIGTERM if self.signal in AS_SIGTERM else self.signal)

    def run(self):
        """Runs the job to its end; returns a JobResult (its status is the launcher's)."""
        self.watchdog = reaper.Watchdog()
        self._since = reaper.now_ticks()
        was_subreaper = reaper.become_subreaper()
        try:
            return self._run()
        finally:
            self.watchdog.close()
            if not was_subreaper:
                reaper.stop_being_subreaper()

    def _run(self):
        result = JobResult(elastic=self.min_workers < self.plan.workers)
        port_retries = attempt = 0
        size = self.plan.workers
        while True:
            self.current = dataclasses.replace(self.plan, workers=size)
            failure = self._attempt(attempt, result.restarts)
            result.workers = size
            attempt += 1
            if self.signal:
                result.signal, result.status = self.signal, stop_status(self.signal)
                return result
            if failure is None:
                return result
            result.failures.append(failure)
            if statuses.is_address_error(failure.status, failure.last_line) and \
                    not self.plan.multi_host and port_retries < self.port_retries:
                port_retries += 1
                self.output.note(f"{failure.describe()}; retrying on new ports "
                                 f"({port_retries} of {self.port_retries}).")
                continue
            lost = self._lost_hosts() if result.elastic else 0
            if lost:
                size = self._after_lost_hosts(failure, size - lost, lost, result)
                if size is None:
                    return result
                continue
            if statuses.is_restartable(failure.status) and \
                    result.restarts < self.max_restarts:
                result.restarts += 1
                size = self.plan.workers
                on = f" on {_workers(size)}" if result.elastic else ""
                self.output.note(f"{failure.describe()}; every task stopped, restarting "
                                 f"the job{on} ({result.restarts} of {self.max_restarts}).")
                continue
            result.notes += self._why_no_restart(failure, result)
            result.status = failure.status
            return result

    def _why_no_restart(self, failure, result):
        """The summary's words on why a failure ended the job: a restart budget used up,
        or a fixed-size job's 69, which only --workers MIN:MAX restarts on."""
        if failure.status == statuses.HOST_LOST and not result.elastic:
            count = self.plan.workers
            return [f"a fixed --workers {count} never restarts on {statuses.HOST_LOST} (a "
                    f"lost host); --workers MIN:{count} (MIN < {count}) would restart on "
                    "the workers that remain"]
        if statuses.is_restartable(failure.status):
            return [_budget_spent(self.max_restarts)]
        return []

    def _after_lost_hosts(self, failure, remaining, lost, result):
        """The size of the restart on the `remaining` workers, or None: the job ends
        with HOST_LOST (fewer than min_workers remain, or no restart is left)."""
        if remaining < self.min_workers:
            result.notes.append(f"{_workers(remaining)} left after {lost} lost host(s), "
                                f"fewer than the {self.min_workers} --workers asks for "
                                "at least")
        elif result.restarts >= self.max_restarts:
            result.notes.append(_budget_spent(self.max_restarts))
        if remaining < self.min_workers or result.restarts >= self.max_restarts:
            result.status = statuses.HOST_LOST
            return None
        result.restarts += 1
        self.output.note(
            f"{failure.describe()}; {lost} worker(s) lost their host: every task stopped, "
            f"restarting the job on the remaining {_workers(remaining)} "
            f"({result.restarts} of {self.max_restarts}).")
        return remaining

    def _lost_hosts(self):
        """How many workers of the attempt just ended exited HOST_LOST."""
        return sum(1 for child in self.children if child.task.job == plan_lib.WORKER
                   and child.status() == statuses.HOST_LOST)

    def _ports(self):
        if self.current.multi_host:
            return ports_lib.HeldPorts([])   # fixed ports, checked by main before the start
        return self.hold_ports(len(self.current.local_tasks()))

    def _attempt(self, attempt, restarts):
        """One start of every local task; returns its first Failure, or None."""
        self.children, self._forwarded = [], {}
        with self._ports() as held:
            cluster = self.current.cluster(held.ports)
            try:
                for task in self.current.local_tasks():
                    if self.signal:
                        break
                    self.output.forget(task)
                    self.children.append(self._start(task, cluster, restarts))
                    if self.signal:   # it came while this task started, before it was listed
                        self._forward_once(self.children[-1])
                since = "" if self.failed_at is None else \
                    f", {time.monotonic() - self.failed_at:.1f} s after the failure"
                size = "" if self.min_workers == self.plan.workers else \
                    f"{_workers(self.current.workers)} of {self.min_workers}.." \
                    f"{self.plan.workers}: "
                self.output.note(f"attempt {attempt + 1}: started {size}{self._started()}"
                                 f"{since}; cluster {cluster}")
                failure = None if self.signal else self._watch(attempt)
            finally:   # a signal to the launcher was forwarded: no second one
                stopping = time.monotonic()
                overdue = children_lib.stop_children(
                    self.children, self.stop_grace_secs,
                    None if self.signal else signal.SIGTERM, watchdog=self.watchdog)
                self._end_orphans()
        if overdue:
            self.output.note(
                f"{', '.join(child.task.name for child in overdue)} did not exit within "
                f"--stop_grace_secs {self.stop_grace_secs:g} of the stop signal: "
                f"SIGKILLed, every task stopped {time.monotonic() - stopping:.1f} s after it.")
        if failure is not None and not any(self.output.stepped(child.task)
                                           for child in self.children):
            self.output.note(f"attempt {attempt + 1} took no step: no task logged one "
                             "(towerlib's 'step N, loss = ...' line) before it ended.")
        return failure

    def _known_pids(self):
        return {child.pid for child in self.children} | {self.watchdog.pid}

    def _watch_orphans(self):
        """Once a second: tells the watchdog the sessions of processes the tasks left
        outside their own (reaper's module text), so that they die with the launcher."""
        if time.monotonic() - self._orphans_looked_at < 1.0:
            return
        self._orphans_looked_at = time.monotonic()
        for session, pids in reaper.orphan_sessions(self._known_pids(),
                                                    self._since).items():
            if session not in self._orphan_sessions:
                self._orphan_sessions.add(session)
                self.watchdog.opened(session)
                self.output.note(f"a task left process(es) {', '.join(map(str, pids))} "
                                 "outside its session (a daemon's setsid()): ended with "
                                 "the attempt.")

    def _end_orphans(self):
        """Ends what the tasks left outside their sessions (reaper's module text)."""
        ended = reaper.end_orphans(self._known_pids(), self._since)
        for session in list(self._orphan_sessions):
            if not reaper.session_members(session):
                self._orphan_sessions.discard(session)
                self.watchdog.closed(session)
        if ended:
            self.output.note(f"ended {len(ended)} process(es) the tasks left outside their "
                             f"sessions (a daemon's setsid()): pid(s) "
                             f"{', '.join(map(str, ended))}.")

    def _started(self):
        return ", ".join(f"{child.task.name} (pid {child.pid})" for child in self.children)

    def _start(self, task, cluster, restarts):
        env = dict(self.env)
        env["TF_CONFIG"] = plan_lib.tf_config(cluster, task)
        env[ports_lib.REUSE_PORT_VARIABLE] = "1"
        env[RESTART_VARIABLE] = str(restarts)
        env.setdefault("PYTHONUNBUFFERED", "1")   # a Python task's lines as they come
        # TensorFlow's C++ start-up banner and INFO lines, on every attempt of every task,
        # bury what the task says; its warnings and errors stay. Set it to show them.
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        child = children_lib.start_child(task, self.command, env, self.output)
        self.watchdog.opened(child.pid)   # its session: the task's pid
        return child

    def _watch(self, attempt):
        """Polls the tasks until the attempt's end (module text); bounded by the tasks."""
        workers_done_at = None
        while not self.signal:
            if self.watchdog.ensure():
                self.output.note("the launcher's watchdog died; started a new one.")
            self._watch_orphans()
            ended = [(child, child.status()) for child in self.children]
            failed = [(child, status) for child, status in ended if status not in (None, 0)]
            if failed:
                self.failed_at = time.monotonic()
                return self._first_failure(attempt, failed)
            running = [child for child, status in ended if status is None]
            if not any(child.task.job == plan_lib.WORKER for child in running):
                if not running:
                    return None
                workers_done_at = workers_done_at or time.monotonic()
                if time.monotonic() - workers_done_at > self.ps_grace_secs:
                    self.output.note(f"{', '.join(c.task.name for c in running)} did not end "
                                     f"within {self.ps_grace_secs:g} s of the workers; "
                                     "stopping it.")
                    return None
            time.sleep(self.poll_secs)
        return None

    def _first_failure(self, attempt, failed):
        """The cause among tasks that ended together: a signal or a mistake before a
        peer's retryable 138, a worker before a ps task."""
        def rank(item):
            child, status = item
            return (status == statuses.RETRYABLE, child.task.job != plan_lib.WORKER,
                    child.started_at, child.task)
        child, status = min(failed, key=rank)
        child.join_readers()
        return Failure(attempt, child.task, status, self.output.last_line(child.task),
                       self.current.workers)
