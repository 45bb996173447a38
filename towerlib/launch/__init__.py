"""One command that starts a job's tasks on this host, and restarts them all after a fault.

    towerlib-launch --workers 2 --max_restarts 3 -- python train.py --train_dir=/tmp/run
    python -m towerlib.launch --workers 2 --ps 1 -- python train.py ...

Each task gets its TF_CONFIG (worker 0 is the chief; ps tasks for the
parameter-server layout), which towerlib.cluster.resolve_cluster reads, on
ports the launcher holds until the task binds them. Every output line is
prefixed with its task. SIGINT and SIGTERM are forwarded to every task
(SIGHUP, a closed terminal, and SIGUSR1, a scheduler's requeue warning, as
SIGTERM; SIGUSR1's status is 143); no process a task started outlives
the launcher, even a SIGKILLed one. A task that exits with a status of
towerlib.cluster.RESTART_STATUSES (138 a lost peer, 137, 143) stops every
other task, and the whole job restarts on new ports, up to --max_restarts;
the scripts resume from their newest checkpoint (each task's
TOWERLIB_LAUNCH_RESTART says which restart it belongs to). The last line is a summary
naming each attempt's first failure; the launcher's status is 0 on success,
else the first failure's.

Elastic: `--workers MIN:MAX` starts MAX workers; a worker that exits HOST_LOST
(69: its host is gone) is left out of the next restart, which runs on the
workers that remain, each with a new TF_CONFIG for that count, as long as at
least MIN remain; any later restart takes MAX again. One machine, all-reduce
only: the scripts must read a global batch that does not depend on the worker
count (towerlib.global_batch_input) to keep the run's trajectory.

TensorFlow's servers listen on every interface, unauthenticated: the launcher
says so in one line, and --private_network keeps a one-host job on loopback.
Nothing here imports TensorFlow: the first task starts at once.

Modules: `command_line` the command line, `plan` the tasks and their TF_CONFIG,
`ports` held free ports, `children` the task processes, `reaper` their
sessions' processes, `network` who can reach the servers, `output` prefixed
lines, `statuses` what an exit status means, `supervisor` the attempts.
"""

from towerlib.launch.children import Child, signal_child, start_child, stop_children
from towerlib.launch.command_line import main, parse_args
from towerlib.launch.network import PrivateNetworkError, enter_private_network, exposure_note
from towerlib.launch.output import Output
from towerlib.launch.plan import JobPlan, Task, parse_task_list, tf_config
from towerlib.launch.ports import (
                                     REUSE_PORT_VARIABLE,
                                     HeldPorts,
                                     PortTakenError,
                                     check_free,
                                     hold_free_ports,
)
from towerlib.launch.reaper import Watchdog, kill_session, session_members
from towerlib.launch.statuses import (
                                     HOST_LOST,
                                     describe_status,
                                     is_address_error,
                                     is_restartable,
                                     shell_status,
)
from towerlib.launch.supervisor import RESTART_VARIABLE, Failure, JobResult, Launcher

__all__ = [
    # the command line
    "main", "parse_args",
    # the job's tasks and their cluster
    "JobPlan", "Task", "parse_task_list", "tf_config",
    # ports held until the tasks bind them
    "REUSE_PORT_VARIABLE", "HeldPorts", "PortTakenError", "check_free", "hold_free_ports",
    # the task processes and their output
    "Child", "Output", "signal_child", "start_child", "stop_children",
    "Watchdog", "kill_session", "session_members",
    # who can reach the tasks' servers
    "PrivateNetworkError", "enter_private_network", "exposure_note",
    # what a status means
    "HOST_LOST", "describe_status", "is_address_error", "is_restartable", "shell_status",
    # the attempts and restarts
    "RESTART_VARIABLE", "Failure", "JobResult", "Launcher",
]
