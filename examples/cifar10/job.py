"""The CIFAR-10 training job: the lesson (train.py) with what a real run needs around it.

`python -m examples.cifar10.train` runs `main` here (and main.py runs `train`):

- the flags: those given, else the run recorded in --train_dir, else the defaults
  (run_folder); the lesson's strategies made of them, an object refusing its argument
  naming the flag; every towerlib option checked by one towerlib.validate_config call,
  its first problem one line naming the flag it came from (`check_flags`);
- the run folder: --overwrite_train_dir, where the run resumes, the checkpoint checked
  against the built graph and the run recorded before the first step; a full disk or a
  NaN loss as one line with the fix (run_errors);
- a cluster: a ps task serves the variables; a worker builds its share of the
  synchronous step, all-reduced across the workers (--variable_update=replicated) or
  through the ps tasks, and runs it with towerlib.cluster.
"""

import contextlib
import logging
import time

import tensorflow as tf

import towerlib
from examples.cifar10 import models, options, planning, run_errors, run_folder
from examples.cifar10 import train as lesson

logger = logging.getLogger("cifar10")

# towerlib's option -> the flag that gives it (the others are named alike).
FLAG_OF = {"update": "variable_update", "precision": "compute_dtype",
           "exchange": "sync_transport"}


def strategies(flags):
    """(update, precision, exchange): the lesson's strategies from the flags. A strategy's
    argument given with another strategy is refused; an object refusing its argument
    names the flag that gave it."""
    options.refuse_unused_strategy_flags(flags)  # e.g. --loss_scale with bfloat16
    argument = ("param_device" if flags.variable_update == "parameter_server"
                else "gradient_pack_bytes")  # the only argument of the update chosen
    with options.blamed_on(flags, argument):
        update = lesson.variable_update(flags)
    with options.blamed_on(flags, "loss_scale"):  # Float16's; the others take none
        precision = lesson.precision(flags)
    return update, precision, lesson.exchange(flags)


def check_flags(flags, update, precision, exchange, cluster=None):
    """Checks every flag before anything is built; returns (model, this process's batch).
    towerlib's options go through ONE towerlib.validate_config call (build_train_graph's
    and run_training's own checks); a problem stops the script: error: --flag=value: ..."""
    batch, optimizer = flags.global_batch_size, None
    if cluster is not None:  # a worker's share of the global batch, its synchronous optimizer
        batch, optimizer = planning.check_cluster_flags(flags, cluster)
    try:
        towerlib.validate_config(
            num_towers=flags.num_towers or None, device_type=flags.device_type or None,
            global_batch_size=batch, bn_mode=flags.bn_mode, optimizer=optimizer,
            update=update, precision=precision, exchange=exchange, ema_decay=flags.ema_decay,
            accumulation_steps=flags.accumulation_steps, learning_rate=flags.learning_rate,
            train_dir=flags.train_dir, max_steps=flags.max_steps,
            save_checkpoint_steps=flags.save_checkpoint_steps,
            save_summaries_steps=flags.save_summaries_steps,
            log_every_n_steps=flags.log_every_n_steps, trace_steps=flags.trace_steps,
            probe_writes=cluster is None or cluster.is_chief)
    except towerlib.ConfigError as error:
        problem = error.problems[0]
        flag = FLAG_OF.get(problem.option, problem.option)
        value = getattr(flags, flag, "")
        if flag == "global_batch_size" and batch != value:
            value = "%d (%d per worker)" % (value, batch)
        raise options.flag_error(flag, value, problem.problem, problem.fix) from None
    return options.check_own_flags(flags, models.make_model), batch  # --model, schedule...


def plan_run(args, defaults=None, cluster=None) -> planning.TrainPlan:
    """Everything decided before the graph is built: the flags (given, else the recorded
    run's, else `defaults`), the strategies, the model, the data, the schedule."""
    flags = run_folder.resolve_flags(args, defaults)  # given flags of another run: refused
    update, precision, exchange = strategies(flags)
    model, batch = check_flags(flags, update, precision, exchange, cluster)
    return planning.make_plan(flags, model, (update, precision, exchange), cluster, batch)


def build_cluster_step(plan):
    """This worker's step in the default graph: its towers' gradients all-reduced with
    every worker's (--variable_update=replicated; every worker its own copies, the chief's
    broadcast at the start) or averaged through the ps tasks. Either way one step is one
    optimizer update per global batch."""
    flags, cluster = plan.flags, plan.cluster
    if flags.seed is not None:  # the chief, which initializes the weights, keeps the seed
        tf.compat.v1.set_random_seed(flags.seed + cluster.replica_index)
    if plan.allreduce:
        placement, where = dict(update=plan.update), tf.device(cluster.task_device)
    else:  # the variables to the ps tasks, the input stays here
        placer = towerlib.cluster.ParameterServerPlacer(cluster)
        placement, where = dict(device_function=placer), tf.compat.v1.device(placer)
    with where:  # through ps tasks only the chief would save the input's position
        global_step, batch, learning_rate, optimizer = lesson.inputs_and_optimizer(
            plan, save_position=plan.allreduce)
    return towerlib.cluster.build_sync_train_graph(
        plan.model, batch, optimizer, cluster, num_towers=len(plan.devices),
        device_type=flags.device_type or None, precision=plan.precision,
        exchange=plan.exchange, bn_mode=flags.bn_mode,
        accumulation_steps=flags.accumulation_steps, ema_decay=flags.ema_decay,
        global_step=global_step, learning_rate=learning_rate, **placement)


def build_step(plan):
    """The training step in the default graph: the lesson's on one machine, else this
    worker's (build_cluster_step)."""
    return lesson.build_step(plan) if plan.cluster is None else build_cluster_step(plan)


def train_on_cluster(plan, before_run, startup_timeout_secs):
    """The lesson's `train` for a worker: its step, run with the cluster's server."""
    with tf.Graph().as_default():
        train_graph = build_cluster_step(plan)
        before_run()
        server = towerlib.cluster.start_server(plan.cluster, len(plan.devices))
        return towerlib.cluster.run_distributed_training(
            train_graph, server, startup_timeout_secs=startup_timeout_secs,
            **plan.loop_options)


def train(args, defaults=None, cluster=None, startup_timeout_secs=600.0):
    """Trains (or resumes) the run that `args`, {flag: value} of the flags given as on the
    command line, describe; returns a planning.TrainResult. cluster: None on one machine."""
    plan = plan_run(args, defaults, cluster)
    flags = plan.flags
    if plan.is_chief and flags.overwrite_train_dir:
        run_folder.start_over(flags.train_dir)
    logger.info(planning.describe(plan))
    restore_from, start_step = planning.restore_point(plan)
    if start_step >= plan.max_steps:
        return planning.TrainResult(start_step, start_step, None, 0.0, plan)

    def record_run():  # the step is built, every check passed: for restarts, eval, export
        if plan.is_chief:
            run_folder.check_checkpoint_fits_graph(restore_from, flags.train_dir)
            run_folder.record(flags, plan.data_dir, plan.max_steps)

    started = time.time()
    # The chief, the run folder's one writer, records the events and traces this life wrote.
    claiming = run_folder.claiming(flags.train_dir) if plan.is_chief else \
        contextlib.nullcontext()
    with run_errors.one_line_errors(flags.train_dir), claiming:
        if cluster is None:
            result = lesson.train(plan, before_run=record_run)
        else:
            result = train_on_cluster(plan, record_run, startup_timeout_secs)
    return planning.finished(plan, start_step, result, started)


def main():
    """The train script: a ps task serves the variables; any other process trains."""
    flags, cluster = options.FLAGS, options.cluster_from_flags()
    if cluster is not None and cluster.is_ps:
        planning.serve_parameters(cluster, flags.variable_update, flags.ps_timeout_secs)
    else:
        return train(options.given(), options.defaults(), cluster,
                     flags.startup_timeout_secs)
