"""Real traced steps of towerlib graphs on 4 virtual CPUs: analysis, Chrome trace, picture."""

import importlib.util
import json
import logging
import sys

import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from tests.trace import built_stats
from towerlib import trace
from towerlib.trace import phases

NUM_TOWERS = 4
FULL_TRACE = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def traced_step(**options):
    """(TrainGraph, RunMetadata) of the second step of the conv+bn model on 4 CPUs."""
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(NUM_TOWERS, tower_fn=helpers.conv_bn_model,
                                             batch_size=16, **options)
        # A deadline, so that a collective left waiting fails the test instead of hanging it.
        config = towerlib.exchange.bounded_session_config(
            towerlib.session_config(NUM_TOWERS), timeout_seconds=60)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            if train.sync_copies_op is not None:
                session.run(train.sync_copies_op)
            session.run(train.train_op)  # the first run prepares the kernels
            metadata = tf.compat.v1.RunMetadata()
            session.run(train.train_op, options=FULL_TRACE, run_metadata=metadata)
    return train, metadata


BUILDS = {
    "all_towers": dict(bn_mode="all_towers"),
    "sync": dict(bn_mode="sync"),
    "sync_collective": dict(bn_mode="sync", exchange="collective"),
    "replicated": dict(bn_mode="all_towers", update="replicated"),
}


@pytest.fixture(scope="module", params=sorted(BUILDS))
def traced(request):
    train, metadata = traced_step(**BUILDS[request.param])
    return request.param, train, metadata


def test_every_tower_found_busy_and_the_phases_add_up_to_the_step(traced):
    build, train, metadata = traced
    profile = trace.analyze_step(metadata, train.devices, step=2)
    assert [t.index for t in profile.towers] == list(range(NUM_TOWERS))
    for tower, device in zip(profile.towers, train.devices):
        assert tower.device.endswith(device.lstrip("/")), (tower.device, device)
        assert tower.busy_micros > 0 and tower.compute_micros > 0, tower
        assert 0 < tower.share <= 1
    assert 0 <= profile.overlap_fraction <= 1
    assert 1 <= profile.mean_towers_computing <= NUM_TOWERS
    assert profile.overlap_micros <= profile.computing_micros <= profile.span_micros
    accounted = sum(profile.phase_partition_micros.values()) + profile.idle_micros
    assert abs(accounted - profile.span_micros) <= 0.05 * profile.span_micros
    assert profile.phase_micros[phases.COMPUTE] > 0
    assert profile.phase_micros[phases.APPLY] > 0
    # Every op not attributed is named (up to 10 of them).
    assert len(profile.unattributed_names) == min(profile.unattributed_count, 10)
    assert all(isinstance(name, str) and name for name in profile.unattributed_names)
    # The towers found from the trace alone are the same.
    found = trace.analyze_step(metadata)
    assert [t.device for t in found.towers] == [t.device for t in profile.towers]
    assert f"traced step 2: {NUM_TOWERS} towers" in profile.summary_line()


def test_exchange_time_only_where_towers_exchange(traced):
    build, train, metadata = traced
    profile = trace.analyze_step(metadata, train.devices)
    exchange_ops = [op for op in profile.ops if op.phase == phases.EXCHANGE]
    if build == "all_towers":  # parameter server, local batch norm: nothing crosses
        assert exchange_ops == [] and profile.phase_micros[phases.EXCHANGE] == 0
        return
    names = {op.event.name.split("/")[0] for op in exchange_ops}
    if build == "sync":  # the 'graph' transport: hub ops in their own scope
        assert "cross_tower_exchange" in names
    elif build == "sync_collective":  # a collective op in every tower
        gathers = {op.tower for op in exchange_ops if op.event.op_type == "CollectiveGather"}
        assert gathers == set(range(NUM_TOWERS))
    else:
        assert "allreduce_gradients" in names
    assert profile.phase_micros[phases.EXCHANGE] > 0


def test_chrome_trace_has_a_process_per_lane_and_rows_that_do_not_overlap(traced, tmp_path):
    _, train, metadata = traced
    path = trace.write_chrome_trace(metadata, tmp_path / "step.json",
                                    tower_devices=train.devices)
    with open(path, encoding="utf-8") as stream:
        events = json.load(stream)["traceEvents"]
    names = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert len(names) == len(metadata.step_stats.dev_stats)
    # The towers' lanes first, in tower order and named by tower,
    # then the others in the trace's order.
    lanes = [lane.device for lane in metadata.step_stats.dev_stats]
    tower_lanes = [next(lane for lane in lanes if lane.endswith(device.split("/")[-1]))
                   for device in train.devices]
    assert names == [f"tower {i} ({lane})" for i, lane in enumerate(tower_lanes)] + [
        lane for lane in lanes if lane not in tower_lanes]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == sum(len(lane.node_stats) for lane in metadata.step_stats.dev_stats)
    assert min(e["ts"] for e in complete) == 0
    rows = {}
    for event in complete:
        assert event["dur"] >= 0 and event["args"]["phase"] in phases.PHASES
        assert event["args"]["name"]
        rows.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["dur"]))
    for row in rows.values():
        row.sort()
        assert all(ts + dur <= next_ts for (ts, dur), (next_ts, _) in zip(row, row[1:]))
    assert list(tmp_path.iterdir()) == [tmp_path / "step.json"]  # no temporary left


def test_chrome_trace_of_gpu_lanes_keeps_every_lane(tmp_path):
    stats = built_stats.gpu_step()
    with open(trace.write_chrome_trace(stats, tmp_path / "gpu.json"),
              encoding="utf-8") as stream:
        events = json.load(stream)["traceEvents"]
    assert sum(e["name"] == "process_name" for e in events) == len(stats.dev_stats) == 11
    kernel = next(e for e in events if e["ph"] == "X" and e["ts"] == 10)
    assert (kernel["name"], kernel["args"]["name"], kernel["args"]["tower"]) == (
        "Conv2D", "tower_0/conv/Conv2D", 0)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_picture_of_a_traced_step(traced, tmp_path):
    _, train, metadata = traced
    profile = trace.analyze_step(metadata, train.devices, step=2)
    path = trace.write_step_picture(profile, tmp_path / "step.png")
    with open(path, "rb") as stream:
        assert stream.read(8) == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == [tmp_path / "step.png"]


def test_picture_without_matplotlib_is_none_and_says_how_to_get_it(
        monkeypatch, caplog, tmp_path):
    for name in ("matplotlib", "matplotlib.backends", "matplotlib.backends.backend_agg",
                 "matplotlib.figure", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    profile = trace.analyze_step(built_stats.two_tower_cpu_step())
    with caplog.at_level(logging.INFO, logger="towerlib"):
        assert trace.write_step_picture(profile, tmp_path / "step.png") is None
    assert len(caplog.records) == 1
    assert "pip install -e '.[plot]'" in caplog.text
    assert list(tmp_path.iterdir()) == []
