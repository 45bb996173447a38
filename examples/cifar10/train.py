r"""Train a CIFAR-10 model on the towers of one machine with towerlib: the example's lesson.

    python -m examples.cifar10.train --num_towers=2 --bn_mode=sync --variable_update=replicated

As TF 1's cifar10_multi_gpu_train.py, top to bottom: 1. the tower function, built on every
device; 2. the input, one GLOBAL batch per step; 3. the strategies from the flags; 4.
build_train_graph and run_training. The script is the job around them (job.py): every
flag checked at once, the run folder (a rerun resumes), a cluster.
"""

if __name__ == "__main__":  # the script: job.py, its flags parsed before TensorFlow loads
    from examples.cifar10 import command_line, options
    command_line.run_script(options.TRAIN_FLAGS + options.CLUSTER_FLAGS, "examples.cifar10.job")

import tensorflow as tf

import towerlib
from examples.cifar10 import input_pipeline

# --- 1. The tower function: the model, written once for every tower ----------------------


class CifarModel(towerlib.TowerModel):
    """towerlib calls build(inputs, ctx) on every device with its share of the batch; ctx:
    which tower, how batch norm runs. The networks (models.py) give the logits."""

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

    def _batch_norm(self, x, ctx, name):  # per tower, or across them: ctx.bn_mode
        return towerlib.batch_norm(x, ctx, name=name, momentum=self.bn_momentum)


# --- 2. The input: the GLOBAL batch, and the optimizer -------------------------------------


def inputs_and_optimizer(plan, save_position=True):
    """All on the host CPU. plan: the run the job made of the flags (planning.TrainPlan).
    The batch is the GLOBAL one: towerlib splits it over the towers, the input knows no
    tower count; its position is in every checkpoint, so a rerun reads on, on any number
    of towers or workers. save_position: the ps path's sharded input saves its position."""
    flags = plan.flags
    with tf.device("/device:CPU:0"):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.name_scope("input"):
            if plan.global_input:  # this worker's slice of the step's global batch
                batch = input_pipeline.global_train_batches(
                    plan.train_files, flags.global_batch_size, plan.augmentation,
                    seed=flags.seed, workers=plan.workers)
            else:  # through ps tasks: each worker its own shard, shuffled
                dataset = input_pipeline.train_dataset(
                    plan.train_files, plan.batch_size, plan.augmentation, seed=flags.seed,
                    num_shards=plan.num_shards, shard_index=plan.shard_index)
                iterator = (towerlib.saved_position_iterator(dataset) if save_position
                            else tf.compat.v1.data.make_one_shot_iterator(dataset))
                batch = iterator.get_next()
        learning_rate = plan.lr_schedule.tensor(global_step)  # in epochs of global batches
        if flags.optimizer == "momentum":
            optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, flags.momentum)
        else:
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    return global_step, batch, learning_rate, optimizer


# --- 3. The strategies: towerlib objects, each checking its arguments when made -----------


def variable_update(flags):
    if flags.variable_update == "parameter_server":  # one copy, gradients summed there
        return towerlib.ParameterServer(device=flags.param_device or "cpu")
    if flags.variable_update == "replicated":  # a copy per tower, gradients all-reduced
        return towerlib.Replicated(pack_bytes=flags.gradient_pack_bytes)
    return flags.variable_update  # no strategy (e.g. mirrored): towerlib refuses it


def precision(flags):  # the towers' arithmetic; weights, loss, checkpoints stay float32
    if flags.compute_dtype != "float16":
        return {"float32": towerlib.Float32(), "bfloat16": towerlib.BFloat16()}.get(
            flags.compute_dtype, flags.compute_dtype)
    try:  # a fixed loss scale, else 'dynamic' (or a name, for towerlib to judge)
        scale = float(flags.loss_scale)
    except ValueError:
        scale = flags.loss_scale or "dynamic"
    return towerlib.Float16(loss_scale=scale)


def exchange(flags):  # between the towers; None: collective on GPUs, else graph
    return {"graph": towerlib.GraphExchange(), "collective": towerlib.CollectiveExchange()
            }.get(flags.sync_transport, flags.sync_transport or None)


# --- 4. Build the step on every tower, and run it -------------------------------------------


def build_step(plan):
    """A towerlib.TrainGraph: the tower function on every device, their gradients combined
    and applied once per global batch (the strategies: section 3's, the job checked them)."""
    flags = plan.flags
    if flags.seed is not None:  # with the seeded input, reruns are bit-identical on CPU
        towerlib.seed_everything(flags.seed)
    global_step, batch, learning_rate, optimizer = inputs_and_optimizer(plan)
    return towerlib.build_train_graph(
        plan.model, batch, optimizer, devices=plan.devices, update=plan.update,
        precision=plan.precision, exchange=plan.exchange, bn_mode=flags.bn_mode,
        accumulation_steps=flags.accumulation_steps, ema_decay=flags.ema_decay,
        global_step=global_step, learning_rate=learning_rate)


def train(plan, before_run=lambda: None):
    """Trains to plan.max_steps, from --train_dir's newest checkpoint if any: run_training's
    result. before_run(): once the step is built (where the job records the run)."""
    with tf.Graph().as_default():
        train_graph = build_step(plan)
        before_run()
        config = towerlib.session_config(len(plan.devices))  # virtual CPU devices too
        return towerlib.run_training(train_graph, session_config=config, **plan.loop_options)
