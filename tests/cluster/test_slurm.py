"""A Slurm job step's environment (as srun sets it) is the cluster."""

import pytest

from towerlib import cluster as cluster_lib

# What srun sets for task 1 of `srun -N 2 --ntasks-per-node=2` on nodes gpu7, gpu8.
SRUN_2X2 = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_STEP_NODELIST": "gpu[7-8]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "TOWERLIB_SLURM_PORT_BASE": "23456"}


@pytest.fixture
def slurm_env(monkeypatch):
    for name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")     # no nvidia-smi: a CPU node

    def set_env(values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return set_env


def test_srun_tasks_are_the_workers_in_node_order(slurm_env):
    slurm_env(SRUN_2X2)
    cluster = cluster_lib.resolve_cluster()
    assert cluster.jobs == {"worker": ("gpu7:23456", "gpu7:23457", "gpu8:23456",
                                       "gpu8:23457")}
    assert (cluster.job_name, cluster.task_index, cluster.is_chief) == ("worker", 1, False)
    assert cluster.num_ps == 0 and cluster.num_replicas == 4


def test_task_0_is_the_chief_and_the_default_port_base_is_8888(slurm_env):
    slurm_env({**SRUN_2X2, "SLURM_PROCID": "0", "TOWERLIB_SLURM_PORT_BASE": ""})
    cluster = cluster_lib.resolve_cluster()
    assert cluster.is_chief and cluster.jobs["worker"][0] == "gpu7:8888"


def test_flags_and_tf_config_come_before_slurm(slurm_env, monkeypatch):
    slurm_env(SRUN_2X2)
    from_flags = cluster_lib.resolve_cluster(
        worker_hosts="127.0.0.1:5000,127.0.0.1:5001", job_name="worker", task_index=0)
    assert from_flags.jobs == {"worker": ("127.0.0.1:5000", "127.0.0.1:5001")}
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, '
                       '"task": {"type": "worker", "index": 1}}')
    assert cluster_lib.resolve_cluster().jobs == {"worker": ("a:1", "b:2")}


def test_a_single_task_step_is_one_machine(slurm_env):
    slurm_env({**SRUN_2X2, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1",
               "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_NODELIST": "gpu7"})
    assert cluster_lib.resolve_cluster() is None


def test_bound_gpus_are_kept(slurm_env, monkeypatch):
    slurm_env(SRUN_2X2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    cluster_lib.resolve_cluster()
    import os
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


@pytest.mark.parametrize("change, named", [
    ({"SLURM_STEP_NODELIST": None}, "SLURM_STEP_NODELIST not set"),
    ({"SLURM_STEP_NUM_TASKS": "four"}, "SLURM_STEP_NUM_TASKS='four'"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x'"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, "SLURM_STEP_TASKS_PER_NODE='1(x2)'"),
    ({"TOWERLIB_SLURM_PORT_BASE": "70000"}, "TOWERLIB_SLURM_PORT_BASE='70000'"),
])
def test_a_wrong_or_partial_environment_is_one_line_naming_the_variable(
        slurm_env, monkeypatch, change, named):
    slurm_env({name: value for name, value in {**SRUN_2X2, **change}.items()
               if value is not None})
    with pytest.raises(ValueError) as raised:
        cluster_lib.resolve_cluster()
    assert named in str(raised.value) and "\n" not in str(raised.value)


def test_ranks_follow_the_nodelist_order_not_the_strings_order(slurm_env):
    """gpu9 holds ranks 0-1 and gpu10 ranks 2-3 (TensorFlow's resolver sorts 'gpu10'
    first, which would give rank 0 gpu10's address)."""
    slurm_env({**SRUN_2X2, "SLURM_STEP_NODELIST": "gpu[9-10]"})
    assert cluster_lib.resolve_cluster().jobs["worker"] == (
        "gpu9:23456", "gpu9:23457", "gpu10:23456", "gpu10:23457")


@pytest.mark.parametrize("text, hosts", [
    ("gpu[9-10]", ["gpu9", "gpu10"]),
    ("n[01-03,7],login", ["n01", "n02", "n03", "n7", "login"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]),
])
def test_hostlists_expand_in_slurms_order(text, hosts):
    from towerlib.cluster import slurm
    assert slurm.expand_hostlist(text) == hosts


def test_a_port_base_whose_last_task_passes_65535_is_refused(slurm_env):
    slurm_env({**SRUN_2X2, "TOWERLIB_SLURM_PORT_BASE": "65535"})
    with pytest.raises(ValueError, match=r"TOWERLIB_SLURM_PORT_BASE=65535 gives a node's "
                       r"tasks the ports 65535\.\.65536, past 65535\. Fix: a port base of "
                       r"at most 65534"):
        cluster_lib.resolve_cluster()
    slurm_env({**SRUN_2X2, "TOWERLIB_SLURM_PORT_BASE": "65534"})
    assert cluster_lib.resolve_cluster().jobs["worker"][1] == "gpu7:65535"


def test_a_rank_outside_the_step_names_the_rank_and_the_task_count(slurm_env):
    slurm_env({**SRUN_2X2, "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "2",
               "SLURM_STEP_TASKS_PER_NODE": "1(x2)"})
    with pytest.raises(ValueError, match=r"SLURM_PROCID=5 is outside this job step's 2 "
                       r"tasks \(ranks 0\.\.1\)"):
        cluster_lib.resolve_cluster()


def test_an_environ_mapping_is_what_the_resolver_reads(slurm_env, monkeypatch):
    """resolve_cluster(environ=...) with Slurm's variables that os.environ lacks."""
    import os
    slurm_env({})
    for name in SRUN_2X2:
        monkeypatch.delenv(name, raising=False)
    cluster = cluster_lib.resolve_cluster(environ=dict(SRUN_2X2))
    assert cluster.jobs["worker"] == ("gpu7:23456", "gpu7:23457", "gpu8:23456", "gpu8:23457")
    assert cluster.task_index == 1
    assert not [name for name in SRUN_2X2 if name in os.environ]  # put back as it was
