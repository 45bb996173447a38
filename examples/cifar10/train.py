r"""Train a CIFAR-10 model on several towers with towerlib: the example's lesson.

    python -m examples.cifar10.train --num_towers=2 --train_epochs=20 --bn_mode=sync \
        --variable_update=replicated --compute_dtype=bfloat16 --trace_steps=20,21

Top to bottom: 1. the tower function (the model), written once, built by towerlib on every
device; 2. the input, one GLOBAL batch per step; 3. the strategies, towerlib objects made
from the flags, every flag checked at once; 4. build_train_graph and run_training. Public
towerlib names only; the other modules here are a real job's machinery (flags, data, the
run folder, errors: docs/cifar10.md). A rerun resumes, taking flags not given from the run.
"""

from examples.cifar10 import command_line, options

SCRIPT_FLAGS = options.TRAIN_FLAGS + options.CLUSTER_FLAGS
# --help and a bad flag answer here, from the flag tables, before TensorFlow loads.
command_line.parse_flags_before_tensorflow(__name__, SCRIPT_FLAGS)

import logging  # noqa: E402
import time  # noqa: E402

import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from towerlib import layers  # noqa: E402
from examples.cifar10 import input_pipeline, planning, run_errors, run_folder  # noqa: E402
from examples.cifar10 import script_runner  # noqa: E402

logger = logging.getLogger("cifar10")

# --- 1. The tower function: the model, written once for every tower ----------------------


class CifarModel(towerlib.TowerModel):
    """One tower's loss on its share of the global batch; subclasses give the logits.

    towerlib calls build(inputs, ctx) once per tower, on its device, with its examples;
    ctx says which tower it is and how batch norm runs. Every tower shares the variables.
    """

    default_weight_decay = 0.0
    default_augmentation = "tutorial"

    def __init__(self, weight_decay=None, bn_momentum=0.99):
        self.weight_decay = self.default_weight_decay if weight_decay is None else weight_decay
        self.bn_momentum = bn_momentum

    def build(self, inputs, ctx):
        images, labels = inputs
        # In float32 whatever the towers compute in (--compute_dtype): a softmax over
        # bfloat16 logits would round the loss to 8 bits before it is averaged.
        logits = tf.cast(self.logits(images, ctx), tf.float32)
        with tf.name_scope("loss"):
            cross_entropy = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))  # the mean over THIS tower's examples
            correct = tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), labels)
            towerlib.tower_scalar(  # one summary, the towers' weighted mean
                ctx, "train_precision_at_1", tf.reduce_mean(tf.cast(correct, tf.float32)))
        return {"loss": cross_entropy, "logits": logits}

    def _batch_norm(self, x, ctx, name):
        return towerlib.batch_norm(x, ctx, name=name, momentum=self.bn_momentum)


class ConvNet(CifarModel):
    """The classic multi-GPU tutorial's network, with batch norm where it had LRN."""

    name = "convnet"
    default_weight_decay = 0.004  # on the fully connected layers only, as in the tutorial

    def logits(self, images, ctx):
        h = layers.conv2d(images, 64, 5, name="conv1", use_bias=False)
        h = layers.max_pool2d(tf.nn.relu(self._batch_norm(h, ctx, "conv1_bn")), 3, 2)
        h = layers.conv2d(h, 64, 5, name="conv2", use_bias=False)
        h = layers.max_pool2d(tf.nn.relu(self._batch_norm(h, ctx, "conv2_bn")), 3, 2)
        h = layers.flatten(h)  # 8 x 8 x 64
        for width, name in ((384, "local3"), (192, "local4")):
            h = layers.dense(h, width, name=name, activation=tf.nn.relu,
                             weight_decay=self.weight_decay)  # counted once, not per tower
        return layers.dense(h, 10, name="softmax_linear")


def make_model(name, weight_decay=None, bn_momentum=0.99) -> CifarModel:
    """'convnet', or a CIFAR ResNet of depth 6n+2 ('resnet20', 'resnet8' for quick tests)."""
    if name == "convnet":
        return ConvNet(weight_decay, bn_momentum)
    from examples.cifar10 import models  # the ResNets, built on CifarModel above
    return models.make_model(name, weight_decay, bn_momentum)


# --- 2. The input: the GLOBAL batch, and the optimizer -------------------------------------


def inputs_and_optimizer(plan):
    """The global step, this process's batch (images, labels), the learning rate and the
    optimizer, on the host CPU. The batch is the global batch (a worker's share of it on a
    cluster): towerlib splits it over the towers, so the input knows no tower count."""
    flags = plan.flags
    with tf.device("/device:CPU:0"):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.name_scope("input"):
            dataset = input_pipeline.train_dataset(
                plan.train_files, plan.batch_size, plan.augmentation, seed=flags.seed,
                num_shards=plan.num_shards, shard_index=plan.shard_index)
            # Its position (files, shuffle buffer, random streams) goes into every
            # checkpoint: a restart reads on. (Through ps tasks only the chief would save
            # it; all-reducing workers each save their own.)
            saved = plan.cluster is None or plan.allreduce
            iterator = (towerlib.saved_position_iterator(dataset) if saved
                        else tf.compat.v1.data.make_one_shot_iterator(dataset))
            batch = iterator.get_next()
        learning_rate = plan.lr_schedule.tensor(global_step)  # in epochs of global batches
        if flags.optimizer == "momentum":
            optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, flags.momentum)
        else:
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    return global_step, batch, learning_rate, optimizer


# --- 3. The strategies from the flags, every flag checked at once -------------------------


def strategies(flags):
    """(update, precision, exchange): the strategy flags as towerlib's objects, each
    checking its arguments when made. A name that is no strategy (--variable_update=
    mirrored) is passed on as it is, for towerlib to refuse."""
    options.refuse_unused_strategy_flags(flags)  # e.g. --loss_scale with bfloat16
    update = flags.variable_update
    if update == "parameter_server":
        with options.blamed_on(flags, "param_device"):
            update = towerlib.ParameterServer(device=flags.param_device or "cpu")
    elif update == "replicated":
        with options.blamed_on(flags, "gradient_pack_bytes"):
            update = towerlib.Replicated(pack_bytes=flags.gradient_pack_bytes)
    precision = {"float32": towerlib.Float32(), "bfloat16": towerlib.BFloat16()}.get(
        flags.compute_dtype, flags.compute_dtype)
    if flags.compute_dtype == "float16":
        with options.blamed_on(flags, "loss_scale"):
            precision = towerlib.Float16(
                loss_scale=options.number_or_name(flags.loss_scale or "dynamic"))
    exchange = {"graph": towerlib.GraphExchange(), "collective": towerlib.CollectiveExchange()
                }.get(flags.sync_transport, flags.sync_transport or None)  # None: by device
    return update, precision, exchange


# towerlib's option -> the flag that gives it (the others are named alike).
FLAG_OF = {"update": "variable_update", "precision": "compute_dtype",
           "exchange": "sync_transport"}


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
    return options.check_own_flags(flags, make_model), batch  # --model, the schedule...


# --- 4. Build the step on every tower, and run it -------------------------------------------


def plan_run(args, defaults=None, cluster=None) -> planning.TrainPlan:
    """Everything decided before the graph is built: the flags (given, else the recorded
    run's, else `defaults`), the strategies, the model, the data, the schedule."""
    flags = run_folder.resolve_flags(args, defaults)  # given flags of another run: refused
    update, precision, exchange = strategies(flags)
    model, batch = check_flags(flags, update, precision, exchange, cluster)
    return planning.make_plan(flags, model, (update, precision, exchange), cluster, batch)


def build_step(plan):
    """The training step in the default graph: a towerlib.TrainGraph on one machine; on
    a cluster this worker's step, its gradients all-reduced with every worker's
    (--variable_update=replicated) or averaged through the ps tasks. Either way one step
    is one optimizer update per global batch."""
    flags, cluster = plan.flags, plan.cluster
    strategy = dict(bn_mode=flags.bn_mode, precision=plan.precision, exchange=plan.exchange,
                    accumulation_steps=flags.accumulation_steps, ema_decay=flags.ema_decay)
    if cluster is None:
        if flags.seed is not None:  # with the seeded input, reruns are bit-identical on CPU
            towerlib.seed_everything(flags.seed)
        global_step, batch, learning_rate, optimizer = inputs_and_optimizer(plan)
        return towerlib.build_train_graph(
            plan.model, batch, optimizer, devices=plan.devices, update=plan.update,
            global_step=global_step, learning_rate=learning_rate, **strategy)
    if flags.seed is not None:  # the chief, which initializes the weights, keeps the seed
        tf.compat.v1.set_random_seed(flags.seed + cluster.replica_index)
    if plan.allreduce:  # every worker its own copies, the chief's broadcast at start
        with tf.device(cluster.task_device):
            global_step, batch, learning_rate, optimizer = inputs_and_optimizer(plan)
        return towerlib.cluster.build_sync_train_graph(
            plan.model, batch, optimizer, cluster, num_towers=len(plan.devices),
            device_type=flags.device_type or None, update=plan.update,
            global_step=global_step, learning_rate=learning_rate, **strategy)
    placer = towerlib.cluster.ParameterServerPlacer(cluster)
    with tf.compat.v1.device(placer):  # variables to the ps tasks, the input stays here
        global_step, batch, learning_rate, optimizer = inputs_and_optimizer(plan)
    return towerlib.cluster.build_sync_train_graph(
        plan.model, batch, optimizer, cluster, num_towers=len(plan.devices),
        device_type=flags.device_type or None, device_function=placer,
        global_step=global_step, learning_rate=learning_rate, **strategy)


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
    started = time.time()
    with tf.Graph().as_default(), run_errors.one_line_errors(flags.train_dir):
        train_graph = build_step(plan)
        if plan.is_chief:  # every check passed: record the run for restarts, eval, export
            run_folder.check_checkpoint_fits_graph(restore_from, flags.train_dir)
            run_folder.record(flags, plan.data_dir, plan.max_steps)
        loop = dict(train_dir=flags.train_dir, max_steps=plan.max_steps,
                    log_every_n_steps=flags.log_every_n_steps, trace_steps=flags.trace_steps,
                    save_checkpoint_steps=flags.save_checkpoint_steps,
                    save_summaries_steps=flags.save_summaries_steps,
                    examples_per_step=flags.global_batch_size)  # the whole cluster's batch
        if cluster is None:
            config = towerlib.session_config(len(plan.devices))  # virtual CPU devices too
            result = towerlib.run_training(train_graph, session_config=config, **loop)
        else:
            server = towerlib.cluster.start_server(cluster, len(plan.devices))
            result = towerlib.cluster.run_distributed_training(
                train_graph, server, startup_timeout_secs=startup_timeout_secs, **loop)
    return planning.finished(plan, start_step, result, started)


def main():
    flags, cluster = options.FLAGS, options.cluster_from_flags()
    if cluster is not None and cluster.is_ps:
        planning.serve_parameters(cluster, flags.variable_update, flags.ps_timeout_secs)
    else:
        train(options.given(), options.defaults(), cluster, flags.startup_timeout_secs)


if __name__ == "__main__":
    command_line.define_script_flags(SCRIPT_FLAGS)
    script_runner.start(main)
