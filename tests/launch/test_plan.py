"""The job's tasks, each one's TF_CONFIG as towerlib.cluster reads it, and the command line."""

import json

import pytest

from towerlib import cluster as cluster_lib
from towerlib.launch import command_line as main_lib
from towerlib.launch import plan as plan_lib
from towerlib.launch import statuses
from towerlib.launch.plan import JobPlan, Task


def test_one_machine_tf_config_per_task_is_the_cluster_towerlib_resolves():
    plan = JobPlan(workers=2, ps=1)
    assert plan.local_tasks() == [Task("worker", 0), Task("worker", 1), Task("ps", 0)]
    jobs = plan.cluster([5001, 5002, 5003])
    assert jobs == {"worker": ["127.0.0.1:5001", "127.0.0.1:5002"], "ps": ["127.0.0.1:5003"]}
    seen = {}
    for task in plan.local_tasks():
        env = {"TF_CONFIG": plan_lib.tf_config(jobs, task)}
        seen[task.name] = cluster_lib.resolve_cluster(environ=env)
    assert seen["worker 0"].is_chief and not seen["worker 1"].is_chief
    assert seen["worker 1"].replica_index == 1 and seen["worker 1"].num_replicas == 2
    assert seen["ps 0"].is_ps and seen["ps 0"].num_ps == 1
    assert "chief" not in json.loads(plan_lib.tf_config(jobs, Task("worker", 0)))["cluster"]


def test_all_reduce_job_has_no_ps_job():
    assert JobPlan(workers=2).cluster([1, 2]) == {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


def test_a_hosts_share_of_a_multi_host_job():
    plan = JobPlan(workers=2, hosts=("a", "b"), host_index=1, port_base=3000)
    assert plan.num_workers == 4
    assert plan.local_tasks() == [Task("worker", 2), Task("worker", 3)]
    assert plan.fixed_ports() == [3000, 3001]
    assert plan.cluster() == {"worker": ["a:3000", "a:3001", "b:3000", "b:3001"]}
    info = cluster_lib.cluster_from_tf_config(plan_lib.tf_config(plan.cluster(),
                                                                 Task("worker", 2)))
    assert info.replica_index == 2 and not info.is_chief


def test_hosts_may_carry_their_own_port_base():
    plan = JobPlan(workers=2, hosts=("a:3000", "b", "[::1]:4000"), host_index=2,
                   port_base=5000)
    assert plan.cluster() == {"worker": ["a:3000", "a:3001", "b:5000", "b:5001",
                                         "[::1]:4000", "[::1]:4001"]}
    assert plan.fixed_ports() == [4000, 4001]


@pytest.mark.parametrize("kwargs, message", [
    (dict(workers=0), "--workers 0: a job needs at least 1 worker"),
    (dict(workers=1, ps=-1), "--ps -1"),
    (dict(workers=1, ps=1, hosts=("a",)), "--ps with --hosts"),
    (dict(workers=1, hosts=("a", "b"), host_index=2), "--host_index 2 is not an index"),
    (dict(workers=2, hosts=("a",), port_base=65535), "port base 65535"),
    (dict(workers=1, hosts=("a:x",)), "--hosts: 'a:x' is not 'name' or 'name:port'"),
    # A host name with a space (or other characters no host name has) is refused.
    (dict(workers=1, hosts=("node 1", "b"), host_index=1),
     "--hosts: 'node 1' is not 'name' or 'name:port'"),
    (dict(workers=1, hosts=("no de:7000",)), "--hosts: 'no de:7000' is not"),
    (dict(workers=1, hosts=("a;rm:7000",)), "--hosts: 'a;rm:7000' is not"),
    # Thousands of task processes on one host is a typo, refused before any starts.
    (dict(workers=3000), "--workers 3000 --ps 0: 3000 task processes on one host; at "
                         "most 256"),
    (dict(workers=200, ps=100), "300 task processes on one host"),
])
def test_impossible_plans_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        JobPlan(**kwargs)


def test_task_list_names_only_local_tasks():
    plan = JobPlan(workers=2, ps=1)
    assert plan_lib.parse_task_list("worker:1, ps:0", plan) == {Task("worker", 1), Task("ps", 0)}
    with pytest.raises(ValueError, match="'worker:2' is not a task this host runs; choose "
                                         "from worker:0, worker:1, ps:0"):
        plan_lib.parse_task_list("worker:2", plan)


@pytest.mark.parametrize("returncode, status, restartable", [
    (0, 0, False), (1, 1, False), (2, 2, False), (138, 138, True),
    (-9, 137, True), (-15, 143, True), (137, 137, True), (-2, 130, False), (-11, 139, False)])
def test_exit_status_mapping(returncode, status, restartable):
    assert statuses.shell_status(returncode) == status
    assert statuses.is_restartable(status) is restartable


def test_status_words():
    assert statuses.describe_status(137) == "killed by SIGKILL"
    assert statuses.describe_status(138) == "a lost peer, retryable"
    assert statuses.describe_status(2) == "a user's mistake"
    assert statuses.describe_status(69) == "its host is lost"
    assert not statuses.is_restartable(statuses.HOST_LOST)   # not on the same host
    assert statuses.is_address_error(2, "error: worker 1: AddressError: cannot listen")
    assert not statuses.is_address_error(2, "error: worker 1: ValueError: --x")


@pytest.mark.parametrize("argv, message", [
    (["--workers", "2", "python", "x.py"], "no command: write it after --"),
    (["--workers", "2", "--"], "no command after --"),
    (["--workers", "0", "--", "python"], "--workers 0: a job needs at least 1 worker"),
    (["--", "python"], "the following arguments are required: --workers"),
    (["--workers", "two", "--", "python"],
     "--workers two: a number of workers N, or MIN:MAX for elastic restarts"),
    (["--workers", "3:2", "--max_restarts", "1", "--", "python"],
     "--workers 3:2: MIN 3 is more than MAX 2. Fix: --workers 2:3."),
    (["--workers", "0:2", "--", "python"], "--workers 0:2: a job needs at least 1 worker"),
    (["--workers", "1:2:3", "--", "python"], "--workers 1:2:3: a number of workers N, or"),
    (["--workers", "1:x", "--", "python"], "--workers 1:x: a number of workers N, or"),
    (["--workers=-1:2", "--", "python"], "--workers -1:2: a number of workers N, or"),
    (["--workers", "1:2", "--max_restarts", "2", "--ps", "1", "--", "python"],
     "--workers 1:2 with --ps: the parameter-server layout has a fixed number"),
    (["--workers", "1:2", "--max_restarts", "2", "--hosts", "a,b", "--host_index", "0",
      "--", "python"], "--workers 1:2 with --hosts: elastic restarts run on one machine"),
    (["--workers", "1:2", "--", "python"],
     "--workers 1:2 with --max_restarts 0: a job resized after a lost host is restarted"),
    (["--workers", "1", "--max_restarts", "-1", "--", "python"], "--max_restarts -1"),
    (["--workers", "1", "--hosts", "a,b", "--", "python"], "--hosts and --host_index go"),
    # Both flags given, the list empty: it said the two flags "go together".
    (["--workers", "1", "--hosts", ",,", "--host_index", "0", "--", "python"],
     "--hosts ',,' names no host"),
    (["--workers", "1", "--tasks", "ps:0", "--", "python"], "'ps:0' is not a task"),
    # A grace of nan compares False with everything: it SIGKILLed every task at once.
    (["--workers", "1", "--stop_grace_secs", "nan", "--", "python"],
     "--stop_grace_secs nan: a number of seconds > 0 (and finite"),
    (["--workers", "1", "--stop_grace_secs", "inf", "--", "python"], "--stop_grace_secs inf"),
    (["--workers", "1", "--ps_grace_secs", "nan", "--", "python"], "--ps_grace_secs nan"),
    # --port_base is a multi-host job's; one host's ports are chosen free.
    (["--workers", "1", "--port_base", "3000", "--", "python"],
     "--port_base 3000 without --hosts: a one-host job's ports are free ones"),
    (["--workers", "1", "--hosts", "a b,c", "--host_index", "0", "--", "true"],
     "--hosts: 'a b' is not 'name' or 'name:port'"),
])
def test_bad_command_lines_are_one_line_and_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main_lib.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("towerlib-launch: error: "), err
    assert message in err


@pytest.mark.parametrize("workers, expected", [("3", (3, 3)), ("2:4", (2, 4)),
                                               ("2:2", (2, 2))])
def test_workers_is_a_count_or_an_elastic_range(workers, expected):
    options, plan, _ = main_lib.parse_args(["--workers", workers, "--max_restarts", "1",
                                            "--", "python"])
    assert (options.min_workers, plan.workers) == expected   # the plan starts with MAX
    assert [task.name for task in plan.local_tasks()][-1] == f"worker {expected[1] - 1}"


def test_a_command_that_cannot_run_is_one_line(capsys):
    with pytest.raises(SystemExit) as exited:
        main_lib.main(["--workers", "2", "--", "/nonexistent/python", "x.py"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "towerlib-launch: error: cannot start '/nonexistent/python'" in err, err


def test_ctrl_c_before_any_task_is_a_status_line_not_a_traceback(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(main_lib, "parse_args", interrupted)
    with pytest.raises(SystemExit) as exited:
        main_lib.main(["--workers", "1", "--", "true"])
    assert exited.value.code == 130
    assert capsys.readouterr().err == (
        "towerlib-launch: stopped by SIGINT before any task started, status 130\n")
