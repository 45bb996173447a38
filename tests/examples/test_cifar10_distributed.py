"""The CIFAR-10 example on a cluster: one ps and two workers as real processes on 127.0.0.1.

Every process runs `python -m examples.cifar10.train` with the same flags (worker 1 gets its
cluster from TF_CONFIG instead), in its own process group, bounded by the ProcessGroup
budget and killed in teardown (tests/distributed_processes.py). The checks on the cluster's
settings and on the data sharding run in this process.
"""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from examples.cifar10 import data, generate, input_pipeline, job, options, run_folder
from examples.cifar10 import eval as eval_lib
from examples.cifar10 import export as export_lib
from tests import helpers
from tests.distributed_processes import REPO_ROOT, free_ports, held_ports
from towerlib import cluster as cluster_lib

MODULE = "examples.cifar10.train"
GLOBAL_BATCH = 16
STEPS = 3
# For the `processes` fixture (tests/conftest.py): what each process runs, and the
# hard bound on every process of the cluster test.
PROCESS_COMMAND = [sys.executable, "-m", MODULE]
PROCESS_BUDGET_SECS = 110


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The built-in generated data set, written once and shared by every process."""
    folder = str(tmp_path_factory.mktemp("data"))
    generate.ensure_generated(folder)
    return folder


@pytest.mark.slow  # a ps and two workers as real processes
def test_one_ps_two_workers_train_and_the_chiefs_run_evaluates(
    processes, tmp_path, data_dir
):
    ps_port, worker0_port, worker1_port = held_ports(3)
    hosts = {
        "ps": [f"127.0.0.1:{ps_port}"],
        "worker": [f"127.0.0.1:{worker0_port}", f"127.0.0.1:{worker1_port}"],
    }
    chief_dir = tmp_path / "chief"
    worker1_dir = tmp_path / "worker1"  # to show that worker 1 writes nothing
    # The same flags for every worker. 5000 examples / 16 = 312.5 steps per epoch, so the
    # decay at epoch 0.0032 comes after global step 1, from step 2 on (a schedule counting
    # each worker's batch of 8 would put it after step 2, from step 3: after this run).
    run_flags = [
        f"--data_dir={data_dir}",
        "--model=resnet8",
        "--num_towers=2",
        "--device_type=cpu",
        f"--global_batch_size={GLOBAL_BATCH}",
        "--bn_mode=all_towers",
        "--learning_rate=0.1",
        "--lr_decay_epochs=0.0032",
        "--ema_decay=0.9",
        f"--max_steps={STEPS}",
        "--log_every_n_steps=1",
        "--save_summaries_steps=1",
        "--seed=1",
        "--startup_timeout_secs=60",
    ]
    host_flags = [
        f"--ps_hosts={hosts['ps'][0]}",
        f"--worker_hosts={','.join(hosts['worker'])}",
    ]
    processes.start(
        "ps", host_flags + ["--job_name=ps", "--task_index=0", "--ps_timeout_secs=90"]
    )
    processes.start(
        "worker0",
        host_flags
        + ["--job_name=worker", "--task_index=0", f"--train_dir={chief_dir}"]
        + run_flags,
    )
    processes.start(
        "worker1",
        [f"--train_dir={worker1_dir}"] + run_flags,
        tf_config={"cluster": hosts, "task": {"type": "worker", "index": 1}},
    )

    # Every process ends on its own: the workers at the last step, the ps once both
    # workers have reported done.
    for name in ("worker0", "worker1", "ps"):
        code = processes.wait(name, PROCESS_BUDGET_SECS)
        assert code == 0, f"{name} exited with {code}.\n" + processes.describe(name)
    assert "every worker is done, exiting" in processes.log_text("ps")

    # Each worker trained its own shard, half the global batch, to the last global step.
    for replica, name in enumerate(("worker0", "worker1")):
        log = processes.log_text(name)
        assert (
            f"as worker {replica} of 2" in log
            and f"8 examples per step of the global batch {GLOBAL_BATCH} (4 per tower)"
            in log
            and f"from shard {replica + 1} of 2 of the training data (2500 examples)" in log
            and "decays x0.1 after steps [1]" in log
        ), processes.describe(name)
        assert f"Trained from global step 0 to {STEPS}" in log, processes.describe(name)

    # The chief alone wrote: its checkpoint is at the last step, worker 1 wrote nothing.
    checkpoint = tf.train.latest_checkpoint(str(chief_dir))
    assert checkpoint and checkpoint.endswith(f"-{STEPS}"), checkpoint
    assert int(tf.train.load_variable(checkpoint, "global_step")) == STEPS
    assert not worker1_dir.exists() or not any(worker1_dir.iterdir())
    saved = run_folder.load(str(chief_dir))
    assert saved.data_dir == data_dir and saved.max_steps == STEPS

    # The schedule counted global steps: the update from global step 2 used the decayed
    # rate. (The summary of a step is written at the step that update produced.)
    rates = dict(helpers.event_scalars(str(chief_dir)).get("learning_rate", []))
    assert sorted(rates) == [1, 2, 3], rates
    assert [rates[1], rates[2], rates[3]] == pytest.approx([0.1, 0.1, 0.01]), rates

    # Eval and export work on the chief's train_dir, with the weights' moving averages.
    result = eval_lib.evaluate_latest(str(chief_dir))
    assert result.global_step == STEPS and result.ema
    assert result.examples == 1000 and 0 <= result.correct <= 1000
    saved_model = export_lib.export(str(chief_dir))
    assert os.path.basename(saved_model) == str(STEPS)
    assert os.path.isfile(os.path.join(saved_model, "saved_model.pb"))


def _cluster(workers=2):
    ps, *worker_ports = free_ports(1 + workers)
    return cluster_lib.cluster_from_flags(
        f"127.0.0.1:{ps}", ",".join(f"127.0.0.1:{p}" for p in worker_ports), "worker", 0
    )


def _config(tmp_path, data_dir, **overrides):
    settings = dict(
        train_dir=str(tmp_path / "train"),
        data_dir=data_dir,
        model="resnet8",
        num_towers=2,
        device_type="cpu",
        global_batch_size=GLOBAL_BATCH,
        max_steps=STEPS,
    )
    settings.update(overrides)
    return settings  # the train flags given


def test_sync_batch_norm_across_workers_is_refused_with_the_librarys_reason(
    tmp_path, data_dir
):
    with pytest.raises(options.FlagError) as error:
        job.plan_run(_config(tmp_path, data_dir, bn_mode="sync"), cluster=_cluster())
    message = str(error.value)
    assert message.startswith("--bn_mode=sync: bn_mode='sync' cannot span the 2 workers")
    assert "Use bn_mode='all_towers'" in message
    # One worker is one machine's towers: sync is fine there.
    plan = job.plan_run(_config(tmp_path, data_dir, bn_mode="sync"), cluster=_cluster(1))
    assert plan.batch_size == GLOBAL_BATCH


@pytest.mark.parametrize(
    "overrides, problem, fix",
    [
        (
            {"global_batch_size": 15},
            "--global_batch_size=15 does not divide over the 2 workers of this cluster: "
            "each worker trains on global_batch_size / workers examples per step",
            "Use a multiple of 2, e.g. 14 or 16.",
        ),
        (
            {"global_batch_size": 2},
            "--global_batch_size=2 (1 per worker): is 1, fewer than the 2 towers, so some "
            "tower would get no examples.",
            "Fix: use a global batch of at least 2 or fewer towers.",
        ),
        (
            {"compute_dtype": "float16"},
            "--compute_dtype=float16: towerlib.Float16() with SyncReplicasOptimizer: a "
            "replica that skips an overflowing step sends no gradients",
            "Fix: towerlib.BFloat16() (no loss scaling) across machines.",
        ),
        (
            {"param_device": "gpu"},
            "--param_device=gpu: in a cluster the variables live on the ps tasks",
            "Leave --param_device at its default (cpu)",
        ),
    ],
)
def test_cluster_settings_that_cannot_work_name_the_flag_and_the_fix(
    tmp_path, data_dir, overrides, problem, fix
):
    with pytest.raises(options.FlagError) as error:
        job.plan_run(_config(tmp_path, data_dir, **overrides), cluster=_cluster())
    assert str(error.value).startswith(problem) and fix in str(error.value), error.value


def test_each_worker_gets_its_share_of_the_batch_and_a_distinct_shard(tmp_path, data_dir):
    plans = []
    for task in (0, 1, 2):
        ps, w0, w1, w2 = 2222, 2223, 2224, 2225  # not opened: only described
        cluster = cluster_lib.cluster_from_flags(
            f"127.0.0.1:{ps}",
            f"127.0.0.1:{w0},127.0.0.1:{w1},127.0.0.1:{w2}",
            "worker",
            task,
        )
        plans.append(
            job.plan_run(_config(tmp_path, data_dir, global_batch_size=48), cluster=cluster)
        )
    assert [p.batch_size for p in plans] == [16, 16, 16]
    assert [(p.num_shards, p.shard_index) for p in plans] == [(3, 0), (3, 1), (3, 2)]
    assert [p.is_chief for p in plans] == [True, False, False]
    assert plans[1].devices == [
        "/job:worker/task:1/device:CPU:0",
        "/job:worker/task:1/device:CPU:1",
    ]
    # The schedule and the last step are stated in global batches, as on one machine.
    one_machine = job.plan_run(
        _config(
            tmp_path, data_dir, global_batch_size=48, lr_decay_epochs=[2.0], train_epochs=3
        )
    )
    three_workers = job.plan_run(
        _config(
            tmp_path, data_dir, global_batch_size=48, lr_decay_epochs=[2.0], train_epochs=3
        ),
        cluster=cluster,
    )
    assert three_workers.lr_schedule == one_machine.lr_schedule
    assert three_workers.max_steps == one_machine.max_steps == round(3 * 5000 / 48)


def _records(dataset):
    return [
        image.tobytes() + bytes([label]) for image, label in dataset.as_numpy_iterator()
    ]


def test_training_shards_are_disjoint_and_cover_the_split(tmp_path):
    generate.generate(str(tmp_path), train_per_file=7, test_examples=5)  # 35 examples
    files = data.validate_split(str(tmp_path), "train")
    everything = _records(input_pipeline.train_records(files))
    shards = [_records(input_pipeline.train_records(files, 3, i)) for i in range(3)]
    assert [len(s) for s in shards] == [12, 12, 11]
    assert [input_pipeline.shard_size(35, 3, i) for i in range(3)] == [12, 12, 11]
    assert sorted(sum(shards, [])) == sorted(everything)
    assert len(set(everything)) == 35  # so "disjoint" means something
    with pytest.raises(ValueError, match="shard_index must be in 0..2"):
        input_pipeline.train_records(files, 3, 3)
    # The training stream of one worker: batches of its share, from its shard.
    images, labels = next(
        iter(
            input_pipeline.train_dataset(
                files, 4, "resnet", seed=1, num_shards=3, shard_index=2
            )
        )
    )
    assert images.shape == (4, 32, 32, 3) and labels.shape == (4,)


def test_workers_generating_the_data_at_once_keep_one_copy(tmp_path, monkeypatch):
    """Workers sharing a train_dir both generate the default data: the one that finishes
    second keeps the first one's copy (the same bytes) and deletes nothing."""
    folder = str(tmp_path)
    write_records = data.write_records
    other = {}

    def write_while_another_worker_finishes(path, images, labels):
        if not other:  # the other worker installs its copy while this one writes
            monkeypatch.setattr(data, "write_records", write_records)
            other["path"] = generate.ensure_generated(folder)
            other["inode"] = os.stat(os.path.join(other["path"], "data_batch_1.bin")).st_ino
            monkeypatch.setattr(data, "write_records", write_while_another_worker_finishes)
        write_records(path, images, labels)

    monkeypatch.setattr(data, "write_records", write_while_another_worker_finishes)
    path = generate.ensure_generated(folder)
    assert path == other["path"]
    assert os.stat(os.path.join(path, "data_batch_1.bin")).st_ino == other["inode"]
    assert sorted(os.listdir(folder)) == [data.BATCHES_DIR]  # no staging folder left
    assert data.validate_split(folder, "train").num_examples == 5000


@pytest.mark.slow  # the train script in a fresh process
def test_train_script_refuses_sync_batch_norm_on_a_cluster_in_one_line(tmp_path, data_dir):
    # Refused before this worker starts its server or waits for anyone: no cluster needed.
    ps, worker0, worker1 = free_ports(3)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            MODULE,
            f"--ps_hosts=127.0.0.1:{ps}",
            f"--worker_hosts=127.0.0.1:{worker0},127.0.0.1:{worker1}",
            "--job_name=worker",
            "--task_index=1",
            f"--train_dir={tmp_path / 'train'}",
            f"--data_dir={data_dir}",
            "--num_towers=2",
            "--device_type=cpu",
            "--bn_mode=sync",
        ],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert (
        "error: --bn_mode=sync: bn_mode='sync' cannot span the 2 workers of this cluster"
        in completed.stderr
    )
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "train").exists()


@pytest.mark.slow  # the train script in a fresh process
def test_a_worker_whose_peers_never_start_exits_retryable_in_one_line(tmp_path, data_dir):
    """The example exits 138 (restart every task), as a user's own
    script under towerlib.cluster.exit_by_meaning does, not 1 or 2."""
    worker0, worker1 = free_ports(2)
    completed = subprocess.run(
        [sys.executable, "-m", MODULE, f"--worker_hosts=127.0.0.1:{worker0},127.0.0.1:{worker1}",
         "--job_name=worker", "--task_index=1", "--variable_update=replicated",
         f"--train_dir={tmp_path / 'train'}", f"--data_dir={data_dir}", "--num_towers=2",
         "--device_type=cpu", "--model=resnet8", "--startup_timeout_secs=4"],
        cwd=REPO_ROOT, env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
        capture_output=True, text=True, timeout=120)
    assert completed.returncode == cluster_lib.RETRYABLE, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "worker task 0" in errors[0] and "did not start" in errors[0]
    assert "Traceback" not in completed.stderr
