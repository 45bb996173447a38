"""The command line: `towerlib-launch` and `python -m towerlib.launch`.

    towerlib-launch --workers 2 -- python train.py --train_dir=/tmp/run
    towerlib-launch --workers 2 --ps 1 --max_restarts 3 -- python train.py ...
    # elastic: 4 workers, down to 2 when hosts are lost, back up at a later restart
    towerlib-launch --workers 2:4 --max_restarts 5 -- python train.py ...
    # several machines: the same command on each host, with its own --host_index
    towerlib-launch --workers 2 --hosts node1,node2 --host_index 0 -- python train.py

Everything after `--` is the task's command. The launcher's exit status is 0
when every task ended 0, else the first failure's status (128 + s when the
launcher was stopped by signal s: SIGINT, SIGTERM, SIGHUP; 143 for SIGUSR1, a
scheduler's requeue warning, which reaches the tasks as SIGTERM). A wrong option
is one line, status 2.

The tasks' TensorFlow servers listen on every interface with no authentication;
the launcher says so in one line, and `--private_network` runs a one-host job
in a network namespace of its own that has only loopback (launch.network).
This module imports no TensorFlow: the first task starts at once.
"""

import argparse
import math
import signal
import sys

from towerlib.launch import network, statuses, supervisor
from towerlib.launch import output as output_lib
from towerlib.launch import plan as plan_lib
from towerlib.launch import ports as ports_lib

__all__ = ["main", "parse_args"]

PROG = "towerlib-launch"
# SIGHUP (a closed terminal) is a stop like SIGTERM: forwarded, summarized, 129.
# SIGUSR1 (Slurm's --signal=USR1@N before a time limit) too, forwarded as SIGTERM so
# that the tasks save, and 143: its own 128 + 10 = 138 would say "restart me".
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


class UsageError(ValueError):
    """A wrong command line; the message is the one line the user sees."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, not argparse's usage block
        raise UsageError(message)


def _parser():
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                     usage=f"{PROG} --workers N [options] -- COMMAND [ARGS...]")
    add = parser.add_argument
    add("--workers", required=True,
        help="worker tasks on this host (the whole job's on one machine); MIN:MAX for "
             "elastic restarts: a restart after a task exits "
             f"{statuses.HOST_LOST} (its host is lost) runs on the workers that "
             "remain, if at least MIN do; any later restart takes MAX again")
    add("--ps", type=int, default=0, help="ps tasks (parameter-server layout; one machine)")
    add("--max_restarts", type=int, default=0,
        help="restarts of every task after a retryable failure (status 137, 138, 143)")
    add("--tasks", default="",
        help="show only these tasks' output, e.g. worker:0,ps:0 (default: all)")
    add("--hosts", default="",
        help="every host of a multi-host job, the same on each host: name or name:port "
             "(that host's own port base)")
    add("--host_index", type=int, default=None, help="this host's index in --hosts")
    add("--port_base", type=int, default=None,
        help="multi-host (with --hosts): worker i of a host listens on port_base + i "
             f"(default {plan_lib.DEFAULT_PORT_BASE})")
    add("--stop_grace_secs", type=float, default=10.0,
        help="how long a task may take to exit after SIGTERM before SIGKILL")
    add("--ps_grace_secs", type=float, default=30.0,
        help="how long ps tasks may take to end after the workers are done")
    add("--private_network", action="store_true",
        help="one host: run the tasks in a network namespace with loopback only, so "
             "that no other host reaches their servers (the tasks have no outside "
             "network then)")
    return parser


def _worker_range(text):
    """'4' -> (4, 4); '2:4' -> (2, 4): the fewest and the most workers of the job."""
    parts = text.split(":")
    if len(parts) > 2 or not all(part.strip().isdigit() for part in parts):
        raise UsageError(f"--workers {text}: a number of workers N, or MIN:MAX for "
                         "elastic restarts (e.g. --workers 2:4).")
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise UsageError(f"--workers {text}: a job needs at least 1 worker"
                         + (" (MIN is 1 or more)." if len(parts) == 2 else "."))
    if low > high:
        raise UsageError(f"--workers {text}: MIN {low} is more than MAX {high}. "
                         f"Fix: --workers {high}:{low}.")
    return low, high


def _check_elastic(options, hosts):
    """--workers MIN:MAX: one machine, all-reduce only, restarts allowed."""
    low, high = options.workers
    if low == high:
        return
    if hosts:
        raise UsageError(f"--workers {low}:{high} with --hosts: elastic restarts run on "
                         "one machine (the hosts' launchers do not agree on who remains). "
                         "Fix: a fixed --workers, or drop --hosts.")
    if options.ps:
        raise UsageError(f"--workers {low}:{high} with --ps: the parameter-server layout "
                         "has a fixed number of replicas. Fix: a fixed --workers, or "
                         "all-reduce without --ps.")
    if options.max_restarts < 1:
        raise UsageError(f"--workers {low}:{high} with --max_restarts "
                         f"{options.max_restarts}: a job resized after a lost host is "
                         "restarted. Fix: --max_restarts 1 or more.")


def parse_args(argv):
    """(options, plan, command) from the command line; UsageError names what is wrong."""
    if "--" not in argv:
        if any(arg in ("-h", "--help") for arg in argv):
            _parser().print_help()
            raise SystemExit(0)
        raise UsageError("no command: write it after --, e.g. "
                         f"{PROG} --workers 2 -- python train.py")
    split = argv.index("--")
    options, command = _parser().parse_args(argv[:split]), argv[split + 1:]
    if not command:
        raise UsageError("no command after --, e.g. -- python train.py")
    if options.max_restarts < 0:
        raise UsageError(f"--max_restarts {options.max_restarts}: 0 or more.")
    for name in ("stop_grace_secs", "ps_grace_secs"):
        value = getattr(options, name)
        if not (math.isfinite(value) and value > 0):   # nan compares False to all
            raise UsageError(f"--{name} {value}: a number of seconds > 0 (and finite: "
                             "every wait of the launcher has a bound).")
    hosts = tuple(host.strip() for host in options.hosts.split(",") if host.strip())
    if options.hosts.strip() and not hosts:
        raise UsageError(f"--hosts {options.hosts!r} names no host. Fix: the hosts, "
                         "comma-separated, e.g. --hosts node1,node2.")
    if bool(hosts) != (options.host_index is not None):
        raise UsageError("--hosts and --host_index go together: the host list, the "
                         "same on every host, and this host's index in it.")
    if options.port_base is not None and not hosts:
        raise UsageError(f"--port_base {options.port_base} without --hosts: a one-host "
                         "job's ports are free ones the launcher chooses. Fix: drop "
                         "--port_base, or give --hosts and --host_index.")
    if options.private_network and hosts:
        raise UsageError("--private_network with --hosts: a private network has only "
                         "loopback, so other hosts cannot join. Fix: drop one of them.")
    options.workers = _worker_range(options.workers)
    _check_elastic(options, hosts)
    options.min_workers, options.workers = options.workers
    try:
        plan = plan_lib.JobPlan(
            options.workers, options.ps, hosts, options.host_index or 0,
            plan_lib.DEFAULT_PORT_BASE if options.port_base is None else options.port_base)
        if options.tasks:
            options.tasks = plan_lib.parse_task_list(options.tasks, plan)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return options, plan, command


def _usage_exit(message):
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def main(argv=None):
    """Runs the job the command line describes; exits with its status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options, plan, command = parse_args(argv)
        if options.private_network:
            network.enter_private_network()   # before any thread or task starts
        if plan.multi_host:
            ports_lib.check_free(plan.fixed_ports(), "this host's, from --port_base or --hosts")
    except (UsageError, ports_lib.PortTakenError, network.PrivateNetworkError) as error:
        _usage_exit(str(error))
    except KeyboardInterrupt:   # Ctrl-C before the handlers: a status line, no traceback
        sys.stderr.write(f"{PROG}: stopped by SIGINT before any task started, "
                         f"status {128 + signal.SIGINT}\n")
        raise SystemExit(128 + signal.SIGINT) from None
    output = output_lib.Output(shown=options.tasks or None)
    if options.private_network:
        output.note("the tasks run in a private network namespace: loopback only, "
                    "unreachable from other hosts, and without outside network.")
    else:
        output.note(network.exposure_note(plan))
    launcher = supervisor.Launcher(
        command, plan, output, max_restarts=options.max_restarts,
        min_workers=options.min_workers,
        stop_grace_secs=options.stop_grace_secs, ps_grace_secs=options.ps_grace_secs)
    previous = {signum: signal.signal(signum, lambda s, _: launcher.forward_signal(s))
                for signum in _FORWARDED}
    try:
        result = launcher.run()
    except OSError as error:   # the command cannot be run; every task is stopped
        _usage_exit(f"cannot start {command[0]!r}: {error.strerror or error}")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    output.note(result.summary())
    raise SystemExit(result.status)
