"""A run resumed on another topology continues the run that never stopped.

Each pair trains 10 steps on one topology (W workers x N towers x k
accumulation micro-batches), then 10 more on another from the same
train_dir, and compares the chief's checkpoint at step 20 with that of a run
that trained 20 steps on the first topology without stopping: every weight,
Momentum slot and batch-norm moving statistic within 1e-5. The processes run
on 127.0.0.1 only (tests/cluster/resized_job.py), each under the test's budget.

With towerlib.global_batch_input the global batch of every step is the same
whatever the topology; with the shard-then-shuffle input each worker's order
depends on the worker count, and the same resized pair misses.
"""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.distributed_processes import ProcessGroup, held_ports

pytestmark = pytest.mark.slow

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resized_job.py")
BUDGET_SECS = 400
STEPS_EACH = 10


@pytest.fixture
def processes(tmp_path):
    group = ProcessGroup(tmp_path, BUDGET_SECS, command=(sys.executable, JOB))
    yield group
    group.close()


def train(processes, train_dir, max_steps, workers, towers, k=1, batch_norm=True,
          kind="global", float16=False, evaluate=False, data_dir=None, shard_update=False):
    """Trains (or resumes) train_dir to max_steps on workers x towers x k."""
    common = [f"--train_dir={train_dir}", f"--max_steps={max_steps}",
              *([f"--data_dir={data_dir}"] if data_dir else []),
              f"--towers={towers}", f"--accumulation_steps={k}",
              f"--batch_norm={int(batch_norm)}", f"--input={kind}",
              f"--workers={workers}", f"--float16={int(float16)}",
              f"--evaluate={int(evaluate)}", f"--shard_update={int(shard_update)}"]
    ports = ",".join(map(str, held_ports(workers))) if workers > 1 else ""
    names = []
    for task in range(workers):
        name = f"{os.path.basename(train_dir)}_{max_steps}_{workers}x{towers}x{k}_{task}"
        processes.start(name, common + [f"--task={task}", f"--ports={ports}"])
        names.append(name)
    for name in names:
        assert processes.wait(name, 200) == 0, processes.describe(name)


def saved_values(train_dir, step):
    """{name: value as float64} of every variable of the checkpoint at `step`."""
    reader = tf.compat.v1.train.NewCheckpointReader(
        os.path.join(str(train_dir), f"model.ckpt-{step}"))
    return {name: np.asarray(reader.get_tensor(name), np.float64)
            for name in sorted(reader.get_variable_to_shape_map())}


def largest_gap(processes, tmp_path, before, after, kind="global", **model):
    """Max |difference| of every saved float value at step 20: resized against
    uninterrupted. before, after: (workers, towers, k)."""
    whole, resized = tmp_path / "uninterrupted", tmp_path / "resized"
    train(processes, whole, 2 * STEPS_EACH, *before, kind=kind, **model)
    train(processes, resized, STEPS_EACH, *before, kind=kind, **model)
    train(processes, resized, 2 * STEPS_EACH, *after, kind=kind, **model)
    return gap_at_20(whole, resized, **model)


def gap_at_20(whole, resized, **model):
    """Max |difference| of every saved float value at step 20, resized against whole,
    after checking that the checkpoints hold what `model` saves and that steps 10 to 20
    move the weights."""
    expected, got = saved_values(whole, 20), saved_values(resized, 20)
    assert sorted(got) == sorted(expected)
    names = list(expected)
    assert any("Momentum" in n for n in names)
    if model.get("batch_norm", True):
        assert any("moving_mean" in n for n in names), names
    if model.get("float16"):
        assert any("loss_scale" in n for n in names), names
    if model.get("evaluate"):
        assert any("towerlib_evaluation" in n for n in names), names
    halfway = saved_values(whole, STEPS_EACH)
    moved = max(np.abs(expected[n] - halfway[n]).max() for n in names)
    assert moved > 1e-2  # the 10 steps after the change do move the weights
    return max(np.abs(expected[n] - got[n]).max() for n in names)


@pytest.mark.parametrize("before, after", [
    ((1, 2, 1), (2, 2, 1)),
    ((1, 4, 1), (1, 2, 1)),
], ids=["1x2_to_2x2", "4_towers_to_2"])
def test_a_resized_run_continues_the_uninterrupted_one(processes, tmp_path, before, after):
    """2 x 2 to one machine of 4 towers: the first two legs of
    test_a_worker_back_with_an_older_folder_takes_the_chiefs_position, checked there."""
    assert largest_gap(processes, tmp_path, before, after) < 1e-5


@pytest.mark.half_precision
@pytest.mark.parametrize("shard_update", [False, True], ids=["replicated", "sharded"])
def test_float16_and_evaluation_state_continue_on_another_topology(processes, tmp_path,
                                                                   shard_update):
    # Sharded, the update (in float16's skip, decided on every sum) and the best
    # checkpoint's saves (which every worker joins) run across the 2 workers too.
    # The loss scale and the early-stopping state (best value, its step, evaluations
    # since) are variables every checkpoint saves and the chief broadcasts. A float32
    # tolerance although the towers compute in float16: both runs give each tower the
    # same shard and the same kernels, so every float16 rounding is the same in both, and
    # only the float32 sums across towers and workers are ordered differently (2**-24 per
    # addition, far below 1e-5 at these magnitudes).
    gap = largest_gap(processes, tmp_path, (2, 2, 1), (1, 4, 1), float16=True,
                      evaluate=True, shard_update=shard_update)
    assert gap < 1e-5


@pytest.mark.parametrize("workers, towers", [(1, 3), (3, 1)], ids=["to_1x3", "to_3x1"])
def test_a_sharded_run_resized_continues_the_unsharded_one(processes, tmp_path, workers,
                                                           towers):
    """Replicated(shard_update=True) on 2 x 2 (each slot held by one of the 4 towers of
    the 2 workers), then from its checkpoint on 1 x 3 or 3 x 1 (the owners recomputed;
    on 3 x 1 a third worker with no folder, and slots owned elsewhere than before,
    refilled from the chief's checkpoint), against Replicated() on 2 x 2 that never
    stopped: every worker's checkpoint holds every slot by its plain name, and step 20
    matches within 1e-5."""
    whole, resized = tmp_path / "uninterrupted", tmp_path / "resized"
    train(processes, whole, 2 * STEPS_EACH, 2, 2)
    train(processes, resized, STEPS_EACH, 2, 2, shard_update=True)
    expected = sorted(saved_values(whole, STEPS_EACH))
    assert sorted(saved_values(resized, STEPS_EACH)) == expected
    assert sorted(saved_values(resized / "worker_1", STEPS_EACH)) == expected
    halfway = saved_values(whole, STEPS_EACH)
    for folder in (resized, resized / "worker_1"):   # gathered whole, the same values
        got = saved_values(folder, STEPS_EACH)
        assert max(np.abs(got[n] - halfway[n]).max() for n in expected) < 1e-5
    train(processes, resized, 2 * STEPS_EACH, workers, towers, shard_update=True)
    assert gap_at_20(whole, resized) < 1e-5


def test_accumulation_may_replace_a_worker(processes, tmp_path):
    # Without batch norm: with k micro-batches a sync batch norm normalizes each
    # micro-batch with that micro-batch's statistics, which is another computation.
    gap = largest_gap(processes, tmp_path, (2, 1, 1), (1, 1, 2), batch_norm=False)
    assert gap < 1e-5


def test_the_shard_then_shuffle_input_misses_the_same_pair(processes, tmp_path):
    gap = largest_gap(processes, tmp_path, (2, 2, 1), (1, 4, 1), kind="sharded")
    assert gap > 1e-3


def test_a_worker_back_with_an_older_folder_takes_the_chiefs_position(processes, tmp_path):
    # 2 x 2 to step 10, one machine to 20, 2 x 2 again to 30: worker 1's folder still
    # holds step 10, and the job goes on from the chief's step 20. Step 20 is also the
    # resized pair 2 x 2 -> 1 x 4 (the uninterrupted run keeps its step-20 checkpoint).
    whole, resized = tmp_path / "uninterrupted", tmp_path / "resized"
    train(processes, whole, 3 * STEPS_EACH, 2, 2)
    for max_steps, topology in ((10, (2, 2)), (20, (1, 4)), (30, (2, 2))):
        train(processes, resized, max_steps, *topology)
    assert gap_at_20(whole, resized) < 1e-5
    chief_log = processes.log_text("resized_30_2x2x1_0")
    assert "Restoring " + str(resized / "model.ckpt-20.") in chief_log
    assert "model.ckpt-10" not in processes.log_text("resized_30_2x2x1_1")
    expected, got = saved_values(whole, 30), saved_values(resized, 30)
    assert max(np.abs(expected[n] - got[n]).max() for n in expected) < 1e-5


def test_a_run_over_tfrecord_shards_resized_twice_continues_the_uninterrupted_one(
        processes, tmp_path):
    # The table as 4 TFRecord shards read by index: 2 x 2 to step 10, one machine of 3
    # towers to 20, 3 workers of one tower to 30, against 2 x 2 for 30 steps.
    from tests.cluster import resized_job
    from tests.data.record_files import write_shards
    data = tmp_path / "shards"
    write_shards(data, *resized_job.table(), num_shards=4)
    whole, resized = tmp_path / "uninterrupted", tmp_path / "resized"
    train(processes, whole, 3 * STEPS_EACH, 2, 2, kind="tfrecords", data_dir=data)
    for max_steps, topology in ((10, (2, 2)), (20, (1, 3)), (30, (3, 1))):
        train(processes, resized, max_steps, *topology, kind="tfrecords", data_dir=data)
    expected, got = saved_values(whole, 30), saved_values(resized, 30)
    assert sorted(got) == sorted(expected)
    assert "global_batches/source_fingerprint" in expected
    moved = max(np.abs(expected[n] - saved_values(whole, 20)[n]).max() for n in expected)
    assert moved > 1e-2  # the last 10 steps move the weights
    assert max(np.abs(expected[n] - got[n]).max() for n in expected) < 1e-5
