"""The hooks of one run_training run, in order, and the step facts they read.

`build_hooks(loop)` assembles what MonitoredTrainingSession would, with towerlib's
pieces: the step logger, the checks that stop a non-finite step, the user's hooks,
evaluation, tracing, the stop signals, summaries, and last the crash-safe saver
(every check of a step runs before that step can be saved).
"""

import dataclasses

import tensorflow as tf

from towerlib import trace
from towerlib.exchange import safety as exchange_safety
from towerlib.run import evaluation_loop, moving_statistics, stopping
from towerlib.run import hooks as hooks_lib


def step_after_update(train_graph):
    """int64 scalar: `global_step` read after `train_graph.train_op` has run.

    Fetch it with the train op to know which step that run produced.
    """
    with train_graph.train_op.graph.as_default(), tf.name_scope("step_after_update"), \
            tf.control_dependencies([train_graph.train_op]):
        global_step = train_graph.global_step
        value = global_step.read_value() if hasattr(global_step, "read_value") else global_step
        return tf.identity(value)


def examples_per_step_of(train_graph):
    """The global batch of one step: an int when static, else an int32 scalar tensor.

    The sum of the towers' batch sizes (`TrainGraph.contexts`); the tensor,
    built here, is cheap to fetch with the step (it reads the batch's shape).
    None when a tower's batch size is unknown.
    """
    sizes = [ctx.batch_size for ctx in train_graph.contexts]
    if not sizes or any(size is None for size in sizes):
        return None
    static = [tf.get_static_value(size) for size in sizes]
    if all(value is not None for value in static):
        return int(sum(static))
    with train_graph.train_op.graph.as_default(), tf.name_scope("examples_per_step"):
        return tf.add_n([tf.cast(size, tf.int32) for size in sizes])


@dataclasses.dataclass
class LoopHooks:
    """The hooks of one run, and the ones the loop reads afterwards."""
    all: list
    step_logger: hooks_lib.StepLogger
    session_keeper: hooks_lib.SessionKeeper
    signal_hook: object        # stopping.SignalStopHook or None
    checkpoint_hook: object    # hooks_lib.CrashSafeSaverHook on the chief, else None
    session_config: object     # the caller's, bounded when collectives can wait
    evaluation_hook: object    # evaluation_loop.EvaluationHook or None

    def last_checkpoint(self):
        return self.checkpoint_hook.last_saved if self.checkpoint_hook else None

    def stop_signal(self):
        return None if self.signal_hook is None else self.signal_hook.received


def build_hooks(loop):
    """Every hook of the run, in order; built before the session finalizes the graph."""
    train_graph, graph = loop.train_graph, loop.graph
    step_after = step_after_update(train_graph)
    summary_writer = None
    if loop.is_chief and loop.save_summaries_steps:
        with graph.as_default():  # the caller may be outside it (eager by default)
            summary_writer = tf.compat.v1.summary.FileWriterCache.get(loop.train_dir)
    step_logger = hooks_lib.StepLogger(
        train_graph.loss, train_graph.global_step, loop.log_every_n_steps,
        loop.examples_per_step if loop.examples_per_step is not None
        else examples_per_step_of(train_graph),
        step_after_update=step_after, loss_scale=train_graph.loss_scale,
        summary_writer=summary_writer, max_steps=loop.max_steps)
    session_keeper = hooks_lib.SessionKeeper()
    all_hooks = [tf.compat.v1.train.StopAtStepHook(last_step=loop.max_steps),
                 step_logger, session_keeper]
    session_config = loop.session_config
    if exchange_safety.has_towerlib_collectives(graph):
        # Sync batch norm: refuse a partial fetch, bound a step that waits.
        all_hooks.append(hooks_lib.CollectiveFetchCheckHook())
        if not (session_config and session_config.operation_timeout_in_ms):
            session_config = exchange_safety.bounded_session_config(
                session_config, loop.collective_timeout_secs)
    all_hooks.extend(check_hooks(train_graph, step_after))
    all_hooks.extend(loop.hooks)
    evaluation_hook = None
    if loop.evaluation is not None:  # before the checkpoint: its state is saved with it
        evaluation_hook = evaluation_loop.EvaluationHook(
            loop.evaluation, step_after, loop.train_dir if loop.is_chief else None,
            loop.scaffold, summary_writer,
            batch_norm_momenta=moving_statistics.layer_momenta(train_graph))
        all_hooks.append(evaluation_hook)
    if loop.trace_steps and loop.is_chief:
        all_hooks.append(trace.TraceHook(loop.trace_steps, loop.train_dir,
                                         global_step=train_graph.global_step,
                                         tower_devices=train_graph.devices))
    signal_hook = (stopping.SignalStopHook(loop.stop_on_signals)
                   if loop.stop_on_signals else None)
    if signal_hook is not None:
        all_hooks.append(signal_hook)
    checkpoint_hook = None
    if loop.is_chief:
        if summary_writer is not None:
            summary_writer.add_graph(graph)
            all_hooks.append(hooks_lib.StepSummaryHook(
                loop.scaffold, summary_writer, loop.save_summaries_steps, loop.max_steps,
                step_after))
        # Last: every check of a step runs before that step can be saved.
        checkpoint_hook = hooks_lib.CrashSafeSaverHook(
            loop.train_dir, loop.scaffold, save_steps=loop.save_checkpoint_steps,
            save_secs=loop.save_checkpoint_secs,
            max_to_keep=loop.max_checkpoints_to_keep,
            stopped_by_signal=lambda: signal_hook is not None and signal_hook.received)
        all_hooks.append(checkpoint_hook)
    return LoopHooks(all_hooks, step_logger, session_keeper, signal_hook, checkpoint_hook,
                  session_config, evaluation_hook)


def check_hooks(train_graph, step_after):
    """The hooks that stop a non-finite step: its loss, or float16's floor."""
    checks = []
    if not train_graph.numerics_guards:
        checks.append(hooks_lib.NonFiniteLossHook(
            train_graph.tower_losses, step_after, train_graph.devices))
    if train_graph.broadcast_op is not None:
        # Across workers a NaN in one worker's data reaches every worker's update
        # through the all-reduce, while its towers look fine elsewhere: every
        # worker checks the global batch's loss, which all of them share.
        checks.append(hooks_lib.NonFiniteLossHook(
            [train_graph.loss], step_after,
            names=["the loss of the global batch over every worker"]))
    if train_graph.loss_scale is not None:
        # float16: a run whose loss scale is at its floor and still overflows stops.
        # Three in a row: a fixed scale's next batch may well fit.
        checks.append(hooks_lib.LossScaleFloorHook(
            train_graph.loss_scale, overflows_in_a_row=3,
            global_step=train_graph.global_step))
    return checks
