"""TraceHook in a MonitoredSession: only the chosen step traced, into TensorBoard and files."""

import importlib.util
import json
import logging
import types

import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import towerlib
from tests import helpers
from towerlib import trace

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def tiny_train_graph(num_towers=2):
    return helpers.build_on_image_batch(num_towers, tower_fn=helpers.conv_dense_model,
                                        batch_size=8)


def test_traces_the_chosen_step_only(tmp_path, caplog):
    with tf.Graph().as_default():
        train = tiny_train_graph()
        hook = trace.TraceHook(steps={2}, output_dir=tmp_path, global_step=train.global_step,
                               tower_devices=train.devices)
        # The step is also fetched alone after each training run: those runs
        # through the hooked session must not count as steps, nor be traced as one.
        steps_after = []
        with caplog.at_level(logging.INFO, logger="towerlib"), \
                tf.compat.v1.train.MonitoredSession(
                    session_creator=tf.compat.v1.train.ChiefSessionCreator(
                        config=towerlib.session_config(2)),
                    hooks=[hook]) as session:
            for _ in range(4):
                session.run(train.train_op)
                steps_after.append(session.run(train.global_step))
    assert steps_after == [1, 2, 3, 4]

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert events.Tags()["run_metadata"] == ["step_2"]  # untraced steps: none
    assert len(events.RunMetadata("step_2").step_stats.dev_stats) >= 2

    assert sorted(hook.profiles) == [2]
    profile = hook.profiles[2]
    assert profile.step == 2 and len(profile.towers) == 2
    assert all(tower.busy_micros > 0 for tower in profile.towers)
    assert profile.summary_line() in caplog.text

    expected = {"trace_step_2.json"} | ({"trace_step_2.png"} if HAS_MATPLOTLIB else set())
    assert {p.name for p in (tmp_path / "traces").iterdir()} == expected
    with open(tmp_path / "traces" / "trace_step_2.json", encoding="utf-8") as stream:
        assert json.load(stream)["otherData"]["summary"] == profile.summary_line()


def _hook_at_step_5(session, train, writer, steps, tmp_path):
    """A TraceHook for `steps`, begun, whose session starts at global step 5."""
    hook = trace.TraceHook(steps=steps, output_dir=tmp_path,
                           global_step=train.global_step, summary_writer=writer)
    hook.begin()
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(train.global_step.assign(5))
    hook.after_create_session(session, None)
    return hook


def test_untraced_runs_ask_for_nothing_and_traced_ones_for_the_trace_only(tmp_path):
    with tf.Graph().as_default():
        train = tiny_train_graph()
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path))
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            hook = _hook_at_step_5(session, train, writer, [1], tmp_path)
            untraced = hook.before_run(None)  # the coming step is 6
            assert untraced.options is None and untraced.feed_dict is None
            assert untraced.fetches is None

            hook = trace.TraceHook(steps=[6], output_dir=tmp_path,
                                   global_step=train.global_step, summary_writer=writer)
            hook.begin()
            hook.after_create_session(session, None)
            traced = hook.before_run(None)
            assert traced.options.trace_level == tf.compat.v1.RunOptions.FULL_TRACE
            assert traced.fetches is None
        writer.close()


def test_a_step_is_traced_whichever_side_of_the_increment_its_step_was_read(tmp_path):
    """A global_step fetched in the same run as the train op may be read after its
    increment (nothing orders them; seen under load): the hook reads the step after
    the run instead, so step 6 is traced even when that run's fetch said 6."""
    with tf.Graph().as_default():
        train = tiny_train_graph()
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path))
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            hook = _hook_at_step_5(session, train, writer, [6], tmp_path)
            args = hook.before_run(None)
            metadata = tf.compat.v1.RunMetadata()
            session.run(train.train_op, options=args.options, run_metadata=metadata)
            read_after_the_increment = {"global_step": 6}
            hook.after_run(types.SimpleNamespace(session=session),
                           tf.compat.v1.train.SessionRunValues(
                               results=read_after_the_increment, options=args.options,
                               run_metadata=metadata))
        writer.close()
    assert (tmp_path / "traces" / "trace_step_6.json").exists()


def test_in_run_training_the_traced_steps_are_the_logged_ones(tmp_path, caplog):
    """run_training(trace_steps=...) adds the hook; only those steps are traced."""
    train_dir = tmp_path / "train"
    with tf.Graph().as_default():
        train = tiny_train_graph()
        with caplog.at_level(logging.INFO, logger="towerlib"):
            result = towerlib.run_training(
                train, train_dir=str(train_dir), max_steps=4, trace_steps=[1, 3],
                session_config=towerlib.session_config(2), log_every_n_steps=1,
                save_summaries_steps=None)
    assert result.global_step == 4
    assert sorted(p.name for p in (train_dir / "traces").glob("*.json")) == [
        "trace_step_1.json", "trace_step_3.json"]
    events = EventAccumulator(str(train_dir))
    events.Reload()
    assert sorted(events.Tags()["run_metadata"]) == ["step_1", "step_3"]
    assert "traced step 3: 2 towers" in caplog.text
    assert (train_dir / "traces" / "trace_step_3.json").exists()


def test_a_resumed_run_says_which_trace_steps_it_has_passed(tmp_path, caplog):
    """Steps already passed when a run resumes traced nothing, silently."""
    train_dir = tmp_path / "train"
    for max_steps, trace_steps in ((3, []), (5, [2, 4])):
        with tf.Graph().as_default():
            train = tiny_train_graph()
            with caplog.at_level(logging.INFO, logger="towerlib"):
                towerlib.run_training(
                    train, train_dir=str(train_dir), max_steps=max_steps,
                    trace_steps=trace_steps, session_config=towerlib.session_config(2),
                    save_summaries_steps=None, save_checkpoint_steps=1)
    assert ("trace_steps [2] is at or before global step 3, where this run starts: those "
            "are not traced") in caplog.text
    assert sorted(p.name for p in (train_dir / "traces").glob("*.json")) == [
        "trace_step_4.json"]
