"""The command line: `towerlib-launch` and `python -m towerlib.launch`.

    towerlib-launch --workers 2 -- python train.py --train_dir=/tmp/run
    towerlib-launch --workers 2 --ps 1 --max_restarts 3 -- python train.py ...
    # several machines: the same command on each host, with its own --host_index
    towerlib-launch --workers 2 --hosts node1,node2 --host_index 0 -- python train.py

Everything after `--` is the task's command. The launcher's exit status is 0
when every task ended 0, else the first failure's status (128 + s when the
launcher was stopped by signal s). A wrong option is one line, status 2.
"""

import argparse
import signal
import sys

from towerlib.launch import output as output_lib
from towerlib.launch import plan as plan_lib
from towerlib.launch import ports as ports_lib
from towerlib.launch import supervisor

__all__ = ["main", "parse_args"]

PROG = "towerlib-launch"
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


class UsageError(ValueError):
    """A wrong command line; the message is the one line the user sees."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, not argparse's usage block
        raise UsageError(message)


def _parser():
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                     usage=f"{PROG} --workers N [options] -- COMMAND [ARGS...]")
    add = parser.add_argument
    add("--workers", type=int, required=True,
        help="worker tasks on this host (the whole job's on one machine)")
    add("--ps", type=int, default=0, help="ps tasks (parameter-server layout; one machine)")
    add("--max_restarts", type=int, default=0,
        help="restarts of every task after a retryable failure (status 137, 138, 143)")
    add("--tasks", default="",
        help="show only these tasks' output, e.g. worker:0,ps:0 (default: all)")
    add("--hosts", default="",
        help="every host of a multi-host job, the same on each host: name or name:port "
             "(that host's own port base)")
    add("--host_index", type=int, default=None, help="this host's index in --hosts")
    add("--port_base", type=int, default=2222,
        help="multi-host: worker i of a host listens on port_base + i")
    add("--stop_grace_secs", type=float, default=10.0,
        help="how long a task may take to exit after SIGTERM before SIGKILL")
    add("--ps_grace_secs", type=float, default=30.0,
        help="how long ps tasks may take to end after the workers are done")
    return parser


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
    if options.stop_grace_secs <= 0 or options.ps_grace_secs <= 0:
        raise UsageError("--stop_grace_secs and --ps_grace_secs are seconds > 0.")
    hosts = tuple(host.strip() for host in options.hosts.split(",") if host.strip())
    if bool(hosts) != (options.host_index is not None):
        raise UsageError("--hosts and --host_index go together: the host list, the "
                         "same on every host, and this host's index in it.")
    try:
        plan = plan_lib.JobPlan(options.workers, options.ps, hosts,
                                options.host_index or 0, options.port_base)
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
        if plan.multi_host:
            ports_lib.check_free(plan.fixed_ports(), "this host's, from --port_base or --hosts")
    except (UsageError, ports_lib.PortTakenError) as error:
        _usage_exit(str(error))
    output = output_lib.Output(shown=options.tasks or None)
    launcher = supervisor.Launcher(
        command, plan, output, max_restarts=options.max_restarts,
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
