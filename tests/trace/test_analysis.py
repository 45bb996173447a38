"""analyze_step on hand-built step_stats: every number known exactly."""

import pytest
import tensorflow as tf

from tests.trace import built_stats
from towerlib import trace
from towerlib.trace import intervals, phases


@pytest.fixture(params=[["/device:CPU:0", "/cpu:1"], None], ids=["given", "found"])
def cpu_profile(request):
    return trace.analyze_step(built_stats.two_tower_cpu_step(), request.param, step=21)


def test_span_and_tower_busy_times(cpu_profile):
    profile = cpu_profile
    assert profile.start_micros == built_stats.BASE
    assert profile.span_micros == 130
    tower0, tower1 = profile.towers
    assert (tower0.index, tower0.device) == (0, built_stats.LOCAL + "CPU:0")
    assert (tower1.index, tower1.device) == (1, built_stats.LOCAL + "CPU:1")
    # Tower 0 owns CPU:0's unscoped ops too: the split, the hub, the apply.
    assert (tower0.busy_micros, tower0.compute_micros, tower0.op_count) == (110, 80, 5)
    assert (tower1.busy_micros, tower1.compute_micros, tower1.op_count) == (85, 80, 3)
    assert tower0.share == 110 / 130 and tower1.share == 85 / 130


def test_overlap_and_towers_at_once(cpu_profile):
    profile = cpu_profile
    # Computing: tower 0 [10,90), tower 1 [30,110): both during [30,90).
    assert profile.overlap_micros == 60
    assert profile.computing_micros == 100
    assert profile.tower_compute_micros == 160
    assert profile.overlap_fraction == 60 / 130
    assert profile.mean_towers_computing == 1.6


def test_phase_times_union_device_sum_and_partition(cpu_profile):
    profile = cpu_profile
    assert dict(profile.phase_micros) == {
        "compute": 100, "exchange": 15, "apply": 10, "input": 10, "other": 5}
    assert dict(profile.phase_device_sum_micros) == {
        "compute": 160, "exchange": 15, "apply": 10, "input": 15, "other": 5}
    # [0,10) input, [10,20) compute, [20,25) exchange, [25,90) compute,
    # [90,100) exchange, [100,110) compute, [110,115) other, [115,120) idle,
    # [120,130) apply.
    assert dict(profile.phase_partition_micros) == {
        "exchange": 15, "apply": 10, "input": 10, "compute": 85, "other": 5}
    assert (profile.busy_micros, profile.idle_micros) == (125, 5)
    assert sum(profile.phase_partition_micros.values()) + profile.idle_micros \
        == profile.span_micros


def test_unattributed_ops_counted_timed_and_named(cpu_profile):
    profile = cpu_profile
    assert profile.op_count == 11
    assert (profile.unattributed_count, profile.unattributed_micros) == (3, 10)
    assert profile.unattributed_names == ("IteratorGetNext", "losses/loss", "_SOURCE")
    by_name = {op.event.name: op for op in profile.ops}
    assert by_name["cross_tower_exchange/bn1/gather"].tower == 0  # by device
    assert by_name["tower_1/conv1/Conv2D"].tower == 1             # by scope
    assert by_name["losses/loss"].tower is None


def test_summary_line(cpu_profile):
    assert cpu_profile.summary_line() == (
        "traced step 21: 2 towers, 0.13 ms; towers overlap 46% of the step "
        "(1.6 computing at once on average); exchange 0.015 ms (12%), "
        "aggregation+apply 0.01 ms (8%), input 0.01 ms; 3 ops (0.01 ms) not attributed")


def test_run_metadata_is_read_like_its_step_stats():
    metadata = tf.compat.v1.RunMetadata()
    metadata.step_stats.CopyFrom(built_stats.two_tower_cpu_step())
    assert trace.analyze_step(metadata) == trace.analyze_step(metadata.step_stats)


def test_gpu_stream_lanes_are_counted_once():
    profile = trace.analyze_step(built_stats.gpu_step(), ["/gpu:0", "/gpu:1"])
    local = built_stats.LOCAL
    assert [d.device for d in profile.devices] == [local + "GPU:0", local + "GPU:1",
                                                   local + "CPU:0"]
    gpu0, gpu1, cpu0 = profile.devices
    # GPU:0: kernels [10,40) and [40,50) once, the copy [2,8) once, the Shape
    # [5,6) (no kernel) kept, the Conv2D's launch dropped.
    assert (gpu0.op_count, gpu0.busy_micros, gpu0.towers) == (4, 46, (0,))
    assert (gpu1.op_count, gpu1.busy_micros, gpu1.towers) == (2, 40, (1,))
    assert (cpu0.op_count, cpu0.busy_micros, cpu0.towers) == (1, 2, ())
    assert profile.op_count == 7
    assert profile.span_micros == 52
    assert [t.compute_micros for t in profile.towers] == [41, 40]
    # Both towers compute during [12,50): 38 of the [5,6) + [10,52) computing.
    assert (profile.overlap_micros, profile.computing_micros,
            profile.tower_compute_micros) == (38, 43, 81)
    kernel = next(op for op in profile.ops if op.event.name == "tower_0/conv/Conv2D")
    assert (kernel.event.op_type, kernel.event.start - built_stats.BASE) == ("Conv2D", 10)
    copy = next(op for op in profile.ops if op.event.name.startswith("edge_"))
    assert (copy.event.op_type, copy.tower) == ("MemcpyH2D", 0)
    assert profile.unattributed_names == ("IteratorGetNext",)


def test_gpu_per_stream_lanes_without_stream_all_are_united():
    lanes = {name: ops for name, ops in {
        "/device:GPU:0/stream:7": [("tower_0/a:MatMul", None, 0, 10)],
        "/device:GPU:0/stream:8": [("tower_0/b:MatMul", None, 5, 10)],
    }.items()}
    profile = trace.analyze_step(built_stats.step_stats(lanes))
    assert [(d.device, d.busy_micros, d.op_count) for d in profile.devices] == [
        ("/device:GPU:0", 15, 2)]
    assert profile.towers[0].device == "/device:GPU:0"


def test_towers_found_from_scopes_on_their_devices():
    profile = trace.analyze_step(built_stats.gpu_step())
    assert [(t.index, t.device) for t in profile.towers] == [
        (0, built_stats.LOCAL + "GPU:0"), (1, built_stats.LOCAL + "GPU:1")]


def test_empty_step():
    profile = trace.analyze_step(built_stats.step_stats({}))
    assert (profile.span_micros, profile.towers, profile.overlap_fraction,
            profile.mean_towers_computing) == (0, (), 0.0, 0.0)
    assert profile.summary_line().startswith("traced step: 0 towers, 0 ms;")


@pytest.mark.parametrize("name, op_type, phase, tower", [
    ("tower_2/conv1/Conv2D", "Conv2D", "compute", 2),
    ("micro_batch_1/tower_3/gradients/micro_batch_1/tower_3/fc1/MatMul_grad/MatMul",
     "MatMul", "compute", 3),
    ("replicated/tower_1/conv1/weights", "VarHandleOp", "compute", 1),
    ("tower_0/bn_conv1/sync_batch_norm/Sum", "Sum", "compute", 0),
    ("tower_0/bn_conv1/sync_batch_norm/bn_conv1_cross_tower_gather_unordered/strided_slice",
     "StridedSlice", "exchange", 0),
    ("cross_tower_exchange/bn_fc1/backward/sum", "AddN", "exchange", None),
    ("allreduce_gradients/allreduce_tower_2/gradients_7_to_0_cross_tower_sum/concat",
     "ConcatV2", "exchange", 2),
    ("tower_1/bn1/bn1_cross_tower_sum/CollectiveReduceV2", "CollectiveReduceV2",
     "exchange", 1),
    ("tower_0/x/NcclAllReduce", "NcclAllReduce", "exchange", 0),
    ("aggregate_gradients/AddN_3", "AddN", "apply", None),
    ("batch_norm_updates/AssignSubVariableOp_2", "AssignSubVariableOp", "apply", None),
    ("GradientDescent/update_replicated/tower_3/conv1/weights/ResourceApplyGradientDescent",
     "ResourceApplyGradientDescent", "apply", 3),
    ("Momentum_1/update_fc1/weights/ResourceApplyMomentum", "ResourceApplyMomentum",
     "apply", None),
    ("GradientDescent", "NoOp", "apply", None),
    ("global_step", "VarHandleOp", "apply", None),
    ("accumulate_tower_1/AddN", "AddN", "apply", 1),
    ("IteratorGetNext", "IteratorGetNext", "input", None),
    ("split_global_batch/split", "Split", "input", None),
    ("tower_1/input/Identity", "Identity", "input", 1),
    ("micro_batch_0_tower_1_input/IteratorGetNext", "IteratorGetNext", "input", 1),
    ("micro_batches/split", "Split", "input", None),
    ("losses/loss", "AddN", "other", None),
    ("conv1/weights/Regularizer/l2_regularizer", "Mul", "other", None),
    ("_SOURCE", "NoOp", "other", None),
])
def test_phase_and_tower_of_towerlib_op_names(name, op_type, phase, tower):
    assert (phases.classify(name, op_type), phases.tower_index(name)) == (phase, tower)


def test_interval_partition_adds_up_to_the_union():
    sets = {"a": [(0, 10), (20, 30)], "b": [(5, 25)], "c": [(40, 41), (41, 45)]}
    assert intervals.union(sets["c"]) == [(40, 45)]
    shares = intervals.partition(sets, ["b", "a", "c"])
    assert shares == {"b": 20, "a": 10, "c": 5}
    assert sum(shares.values()) == intervals.length(i for s in sets.values() for i in s)
