"""Running the training step: a MonitoredSession loop that survives faults.

The loop is what `MonitoredTrainingSession` assembles (a chief session
creator, step, summary and checkpoint hooks), with towerlib's pieces in
place of TensorFlow's where a fault would cost work:

- checkpoints are written crash-safe and restored from the newest complete
  one (towerlib.run.checkpoints), so a restarted job continues from its last
  saved global step even after a SIGKILL in the middle of a save;
- SIGINT/SIGTERM finish the step, save and return (towerlib.run.stopping);
- a non-finite tower loss stops training with an error naming the step and
  the tower, before anything of that step is saved (towerlib.precision.guards), and no
  checkpoint is written while a variable holds NaN or Inf (run.hooks);
- the options are validated together first (towerlib.run.validation).
"""

import collections
import dataclasses
import logging

import tensorflow as tf

from towerlib.checks import data_checks, loop_options, run_time
from towerlib.exchange import safety as exchange_safety
from towerlib.precision import guards
from towerlib.run import (
    checkpoints,
    evaluation_loop,
    folder_lock,
    loop_hooks,
    restore_point,
    sessions,
    stopping,
    validation,
    warm_start,
)
from towerlib.step import devices as devices_lib
from towerlib.update import slot_shards

logger = logging.getLogger("towerlib")


def _ensure_log_output():
    """Shows towerlib's INFO lines when the program configured no logging."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


class TrainingResult(collections.namedtuple("TrainingResult", ["global_step", "loss"])):
    """(global_step, loss) after the last step run, as run_training returned before.

    Attributes:
      global_step: the global step after the last update; when no step ran
        because the restored step was already at or past max_steps, that step.
      loss: the loss of that step (None if no step ran).
      stop_signal: 'SIGINT' or 'SIGTERM' when a signal stopped training, else None.
      checkpoint: the prefix of the newest checkpoint written, or None.
      stopped_early_at: the global step early stopping ended the run at, or None.
      evaluation: the last evaluation's {metric: value} in this run, or None.
      nothing_to_train: True when the run found its work done: the step it
        restored was already at or past max_steps, so no step ran (a
        summary should say so: the same command again trains nothing).
    """

    stop_signal = None
    nothing_to_train = False
    checkpoint = None
    stopped_early_at = None
    evaluation = None


def _session_creator(scaffold, master, session_config, is_chief, train_dir,
                     restore_from, signal_hook, partial=None):
    if is_chief:
        creator = sessions.ChiefSessionCreator(scaffold, master, session_config,
                                               train_dir, restore_from, partial)
    else:
        creator = tf.compat.v1.train.WorkerSessionCreator(
            scaffold=scaffold, master=master, config=session_config)
    return sessions.BoundedSessionCreator(creator, signal_hook)


def run_training(train_graph, *, train_dir, max_steps, hooks=(),
                 session_config=None, master="", is_chief=True,
                 log_every_n_steps=100, save_checkpoint_steps=None,
                 save_checkpoint_secs=None, save_summaries_steps=100,
                 examples_per_step=None, scaffold=None,
                 max_checkpoints_to_keep=5,
                 stop_on_signals=stopping.DEFAULT_SIGNALS,
                 collective_timeout_secs=exchange_safety.DEFAULT_TIMEOUT_SECONDS,
                 session_creator_wrapper=None, trace_steps=(), restore_from="newest",
                 evaluation=None, warm_start_from=None):
    """Runs `train_graph.train_op` until global_step reaches `max_steps`.

    The options are MonitoredTrainingSession's (which this replaces) plus
    towerlib's fault handling; all keyword-only, each with a default, each
    declared once in towerlib.checks.loop_options.LOOP_OPTIONS.

    Args:
      train_graph: a TrainGraph from build_train_graph (with
        `towerlib.guard_numerics(optimizer)` a non-finite step's update is
        never applied; without it, it is applied in memory but never saved).
      train_dir: checkpoints and TensorBoard events go here; training resumes
        from the newest complete checkpoint found in it.
      max_steps: the global step to stop at (not a count of new steps).
      hooks: extra SessionRunHooks (they run before the checkpoint hook, so
        one raising in after_run prevents that step's save).
      session_config: e.g. towerlib.session_config(num_towers); None gives CPU
        towers that config (their virtual devices), GPU towers TensorFlow's default.
      master, is_chief: for distributed training; the chief alone restores
        and writes.
      log_every_n_steps: how often to log the loss and the speed.
      save_checkpoint_steps / save_checkpoint_secs: how often to checkpoint
        (at most one of them; default every 1000 steps); a checkpoint is also
        written at the start and at the end (after max_steps or a signal).
      save_summaries_steps: how often to write summaries (None: never).
      examples_per_step: the global batch size, for examples/sec; by default
        the towers' batch sizes added up, from the graph when they are
        static, else fetched with each step (`towerlib.run.loop_hooks.examples_per_step_of`).
      scaffold: a tf.compat.v1.train.Scaffold (e.g. with its own saver).
      max_checkpoints_to_keep: how many of the newest checkpoints to keep.
      stop_on_signals: signals that stop training cleanly with a final
        checkpoint (default SIGINT and SIGTERM); () to leave signals alone.
      collective_timeout_secs: when the graph has towerlib's collectives
        (bn_mode='sync' through the 'collective' transport, the default on
        GPUs), the deadline of one step (unless session_config sets
        operation_timeout_in_ms), so that a collective left waiting for a
        tower ends in a CollectiveTimeoutError instead of a hang; keep it
        above the slowest legitimate step. The 'graph' transport cannot
        wait for a tower and gets no deadline.
      session_creator_wrapper: a function given run_training's SessionCreator
        that returns the one to use (towerlib.cluster's bounds how long a
        replica waits for a lost ps task); None uses it as it is.
      trace_steps: global steps to run with full tracing (the chief only):
        each writes its RunMetadata to TensorBoard (tag 'step_<n>'), a Chrome
        trace and a PNG into train_dir/traces, and logs one line on how the
        towers overlapped (towerlib.trace). Other steps run as before. At most
        1000 steps, each in [1, max_steps]; an int, or an unbounded iterable
        (itertools.count), is refused after reading at most 1001 items.
      restore_from: 'newest' (the newest complete checkpoint in train_dir),
        a checkpoint prefix, or None to start afresh; across workers every
        worker restores the step they agreed on (towerlib.cluster.allreduce_job).
      evaluation: a towerlib.Evaluation: evaluate every N steps, keep the
        best weights in train_dir/best, stop early (towerlib.run.evaluation_loop).
      warm_start_from: None, a checkpoint prefix, a Keras .h5 weights file, or
        a towerlib.WarmStart (names mapped {new: old}, an include regex): on a
        fresh run only, the model's variables start from it (never the
        optimizer's slots, the global step or towerlib's state); logs which
        it loaded and which it left at their initializer (towerlib.run.warm_start).

    Returns:
      TrainingResult: (global_step, loss) after the last step run, also
      telling which signal stopped training, if any.

    Raises:
      towerlib.ConfigError: bad options, all listed, before anything runs.
      towerlib.NonFiniteError: a tower's loss (or gradient) was NaN or Inf.
      towerlib.CheckpointError: train_dir has checkpoints, none restorable.
      towerlib.DataError: the input ended before the first step.
    """
    trace_steps = loop_options.bounded_trace_steps(trace_steps)  # never unbounded
    wrong = loop_options.loop_argument_problems(hooks, stop_on_signals,
                                                collective_timeout_secs)
    wrong += warm_start.warm_start_problems(warm_start_from)
    if train_graph.broadcast_op is not None and not master:
        wrong.append(("master", "is '' (a session of this process), and the step "
                      "all-reduces across workers (built with workers=): it would wait "
                      "for workers this session cannot reach until the collective timeout.",
                      "run it with towerlib.cluster.run_distributed_training(graph, server, "
                      "...), which waits for every worker and names one that never came."))
    if not slot_shards.saves_whole(train_graph.train_op.graph):
        wrong.append(("update", "shards the optimizer slots over the workers "
                      "(Replicated(shard_update=True), built with workers=), and this "
                      "loop's Saver would save only the slots this worker holds.",
                      "run it with towerlib.cluster.run_distributed_training(graph, "
                      "server, ...), whose Saver saves every slot whole on every worker."))
    if wrong:
        raise validation.ConfigError([validation.ConfigProblem(*p) for p in wrong])
    validation.validate_config(
        train_dir=train_dir, max_steps=max_steps, required=("train_dir", "max_steps"),
        save_checkpoint_steps=save_checkpoint_steps,
        save_checkpoint_secs=save_checkpoint_secs, trace_steps=trace_steps,
        save_summaries_steps=save_summaries_steps, log_every_n_steps=log_every_n_steps,
        examples_per_step=examples_per_step,
        max_checkpoints_to_keep=max_checkpoints_to_keep, master=master,
        is_chief=is_chief, session_config=session_config, restore_from=restore_from,
        scaffold=scaffold, session_creator_wrapper=session_creator_wrapper,
        devices=train_graph.devices, global_batch_size=_static_batch(train_graph, master))
    _check_evaluation(evaluation, train_graph, max_steps)
    if session_config is None and any("CPU" in d.upper() for d in train_graph.devices):
        # Towers on '/device:CPU:i' need that many (virtual) CPU devices.
        session_config = devices_lib.session_config(len(train_graph.devices))
    if save_checkpoint_steps is None and save_checkpoint_secs is None:
        save_checkpoint_steps = 1000
    _ensure_log_output()
    train_dir = str(train_dir)
    graph = train_graph.train_op.graph
    scaffold = scaffold or tf.compat.v1.train.Scaffold()
    hooks = tuple(hooks)
    loop = _Loop(train_graph=train_graph, graph=graph,
                 **loop_options.LOOP_OPTIONS.pick(locals()))
    held = None
    if is_chief:  # the one writer of train_dir: one trainer at a time
        tf.io.gfile.makedirs(train_dir)
        held = folder_lock.hold(train_dir)
    try:
        return _run(loop)
    finally:
        if held is not None:
            held.release()


# run_training's arguments once checked: the step's graph and every LOOP_OPTIONS entry,
# by name (see run_training for each).
_Loop = dataclasses.make_dataclass(
    "_Loop", [("train_graph", object), ("graph", tf.Graph)]
    + [(name, object) for name in loop_options.LOOP_OPTIONS.names], frozen=True)


def _static_batch(train_graph, master):
    """This one process's global batch when the graph fixes it (examples_per_step must
    then agree); None on a cluster (a server's session, or a step across workers: the
    graph holds one replica's share) or when it is known only at run time."""
    static = loop_hooks.examples_per_step_of(train_graph)
    if master or train_graph.broadcast_op is not None or not isinstance(static, int):
        return None
    return static


def _check_evaluation(evaluation, train_graph, max_steps):
    if evaluation is None:
        return
    if not isinstance(evaluation, evaluation_loop.Evaluation):
        raise TypeError(f"evaluation must be a towerlib.Evaluation, got "
                        f"{type(evaluation).__name__}.")
    if evaluation.eval_graph.update_op.graph is not train_graph.train_op.graph:
        raise ValueError(
            "evaluation was built in another graph than the training step. Fix: build "
            "build_eval_graph(..., reuse_variables=True) and the Evaluation in the "
            "training graph, after build_train_graph.")
    if 0 < max_steps < evaluation.every_n_steps:  # max_steps 0 trains nothing at all
        raise ValueError(
            f"evaluation: every_n_steps={evaluation.every_n_steps} is more than "
            f"max_steps={max_steps}, so no evaluation would ever run. Fix: every_n_steps "
            f"<= {max_steps} (e.g. {max(1, max_steps // 4)}), or no evaluation=.")


def _run(loop):
    """run_training once its options are checked and train_dir is held."""
    restore_from, partial = restore_point.restore_point(loop)
    _warm_start(loop, restore_from)
    run_hooks = loop_hooks.build_hooks(loop)
    creator = _session_creator(loop.scaffold, loop.master, run_hooks.session_config,
                               loop.is_chief, loop.train_dir, restore_from,
                               run_hooks.signal_hook, partial)
    run_hooks.all.append(creator.progress_hook)
    try:
        start_step = _train(loop, run_hooks, _wrapped(loop, creator))
    except stopping.StopSignalReceived:
        start_step = None  # while no step could finish: no final checkpoint
    finally:
        if run_hooks.signal_hook is not None:
            run_hooks.signal_hook.uninstall()
    if start_step is None:  # stopped before the first session existed
        start_step = checkpoints.checkpoint_step(
            run_hooks.last_checkpoint() or restore_from or "") or 0
    return _result(loop, run_hooks, start_step)


def _wrapped(loop, creator):
    """The session creator as session_creator_wrapper makes it (if given)."""
    if loop.session_creator_wrapper is None:
        return creator
    wrapped = loop.session_creator_wrapper(creator)
    if not callable(getattr(wrapped, "create_session", None)):
        raise TypeError(
            f"run_training: session_creator_wrapper returned {wrapped!r}, not a "
            "SessionCreator (an object with create_session()). Fix: return the "
            "creator it was given, or one wrapping it.")
    return wrapped


def _warm_start(loop, restore_from):
    """The chief's fresh run starts from warm_start_from; a resume ignores it."""
    if loop.warm_start_from is None or not loop.is_chief:
        return
    if restore_from is not None:
        logger.info("Resuming from %s: warm_start_from=%s is not used (the run's own "
                    "checkpoint restores every variable).", restore_from,
                    warm_start.as_warm_start(loop.warm_start_from).source)
        return
    warm_start.warm_start(loop.graph, loop.warm_start_from, loop.train_graph.global_step)


def _train(loop, run_hooks, creator):
    """Runs steps until max_steps or a stop; returns the global step it started at."""
    train_graph = loop.train_graph
    with loop.graph.as_default(), exchange_safety.explain_collective_errors(loop.graph), \
            tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                                hooks=run_hooks.all) as session:
        # No hooks run, and a lost ps is recovered as for any step.
        start_step = int(session.run_step_fn(
            lambda step_context: step_context.session.run(train_graph.global_step)))
        if start_step >= loop.max_steps:
            logger.info("Nothing to train: global step %d is already at or past "
                        "max_steps=%d in %s (max_steps is the step to stop at, not a "
                        "count of steps). Fix: a higher max_steps to continue this run, "
                        "or another train_dir to start afresh.",
                        start_step, loop.max_steps, loop.train_dir)
        while start_step < loop.max_steps and not session.should_stop():
            _one_step(session, train_graph, run_hooks)
    return start_step


def _one_step(session, train_graph, run_hooks):
    """One training step; a guard's or a data error is raised as towerlib's, named."""
    try:
        session.run(train_graph.train_op)
    except tf.errors.InvalidArgumentError as error:
        guard = next((g for g in train_graph.numerics_guards if g.is_guard_error(error)),
                     None)
        if guard is None and run_time.explained(error):
            raise data_checks.DataError(
                f"{run_time.explained(error)} (the step did not run).") from error
        if guard is None:
            raise
        failure = guard.failure(run_hooks.session_keeper.session)
        raise failure.with_last_checkpoint(run_hooks.last_checkpoint()) from error
    except guards.NonFiniteError as error:
        raise error.with_last_checkpoint(run_hooks.last_checkpoint()) from None


def _result(loop, run_hooks, start_step):
    """The TrainingResult of the run; refuses a run whose input had no batch."""
    step_logger = run_hooks.step_logger
    stopped_early_at = (run_hooks.evaluation_hook.stopped_early_at
                        if run_hooks.evaluation_hook is not None else None)
    if (step_logger.last_step is None and start_step < loop.max_steps
            and run_hooks.stop_signal() is None and stopped_early_at is None):
        raise data_checks.DataError(
            f"The input ended before the first step (global step {start_step}, "
            f"max_steps={loop.max_steps}): check that the dataset yields at least one "
            "global batch (a filter or take() that leaves nothing, files with no "
            "records, drop_remainder with fewer examples than the batch).")
    result = TrainingResult(
        start_step if step_logger.last_step is None else step_logger.last_step,
        step_logger.last_loss)
    result.checkpoint = run_hooks.last_checkpoint()
    result.stopped_early_at = stopped_early_at
    result.nothing_to_train = step_logger.last_step is None and start_step >= loop.max_steps
    if run_hooks.evaluation_hook is not None:
        result.evaluation = run_hooks.evaluation_hook.last_values
    if run_hooks.stop_signal() is not None:
        result.stop_signal = run_hooks.signal_hook.received_name
        logger.warning("Training stopped by %s at step %s; checkpoint %s.",
                       result.stop_signal, result.global_step, result.checkpoint)
    return result
