r"""Train a CIFAR-10 model on several towers (GPUs, or virtual CPU devices) with towerlib.

    python -m examples.cifar10.train --num_towers=2 --model=convnet \
        --global_batch_size=128 --train_epochs=20 --train_dir=/tmp/cifar10_train

One optimizer step consumes one GLOBAL batch, split over the towers; the learning-rate
schedule is stated in epochs of global batches, so it means the same for any tower count.
Logs step, loss, examples/sec and sec/batch; writes TensorBoard summaries (loss, total
loss, learning rate, training precision) and checkpoints to --train_dir, and a restarted
run continues from the last checkpoint's global step. Without --data_dir it trains on the
built-in generated data set and says so.

On a cluster (--ps_hosts, --worker_hosts, --job_name, --task_index, or TF_CONFIG) every
task runs this script with the same flags: a ps task serves the variables until every
worker is done; each worker trains its towers on its own shard of the training data with
global_batch_size / workers examples per step, synchronously (one global step per global
batch, as on one machine); worker 0, the chief, alone writes train_dir. One ps and two
workers on one machine (docs/distributed.md):

    HOSTS="--ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224"
    python -m examples.cifar10.train $HOSTS --job_name=ps --task_index=0 &
    python -m examples.cifar10.train $HOSTS --job_name=worker --task_index=0 \
        --num_towers=2 --train_dir=/tmp/cifar10_dist &
    python -m examples.cifar10.train $HOSTS --job_name=worker --task_index=1 \
        --num_towers=2 --train_dir=/tmp/cifar10_dist &
"""

import dataclasses
import logging
import time
from typing import Optional

import tensorflow as tf

import towerlib
from examples.cifar10 import config as config_lib
from examples.cifar10 import input_pipeline, options, run_errors, run_folder
from examples.cifar10 import script_runner
from examples.cifar10.planning import TrainPlan, describe, make_plan
from towerlib import cluster as cluster_lib

logger = logging.getLogger("cifar10")


@dataclasses.dataclass
class TrainResult:
    global_step: int  # where training stopped
    start_step: int  # where it started (> 0 when resumed from a checkpoint)
    loss: Optional[float]  # the last step's loss (None when no step ran)
    seconds: float  # wall time of the training loop
    plan: TrainPlan


def _inputs_and_optimizer(plan: TrainPlan):
    """The global step, this process's batch, the learning rate and the optimizer, built
    on the host CPU (in a cluster: under the ps placer, so the step lands on a ps task and
    the input on this worker).

    Returns:
      (global_step, (images, labels), learning-rate tensor, optimizer).
    """
    config = plan.config
    with tf.device("/device:CPU:0"):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.name_scope("input"):
            dataset = input_pipeline.train_dataset(
                plan.train_files,
                plan.batch_size,
                config.resolved_augmentation(),
                seed=config.seed,
                num_shards=plan.num_shards,
                shard_index=plan.shard_index,
            )
            if plan.cluster is None:
                # The data position is saved in every checkpoint: a restart reads on.
                iterator = towerlib.saved_position_iterator(dataset)
            else:
                # Only the chief saves; the other workers' positions are not kept.
                iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
            images, labels = iterator.get_next()
        learning_rate = plan.lr_schedule.tensor(global_step)
        if config.optimizer == "momentum":
            optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, config.momentum)
        else:
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    return global_step, (images, labels), learning_rate, optimizer


def build_training(plan: TrainPlan):
    """Builds the input pipeline and the multi-tower training step in the default graph.

    Returns:
      (towerlib.TrainGraph, learning-rate tensor).
    """
    config = plan.config
    if plan.cluster is not None:
        raise ValueError("build_training is for one machine; use build_replica_training.")
    if config.seed is not None:
        # Graph seed, Python and NumPy: with the seeded, order-keeping input pipeline a
        # run repeats bit for bit on CPU (TF's op determinism is not needed there:
        # tests/examples/test_cifar10_exact_runs.py).
        towerlib.seed_everything(config.seed)
    global_step, (images, labels), learning_rate, optimizer = _inputs_and_optimizer(plan)
    train_graph = towerlib.build_train_graph(
        config.make_model(),
        (images, labels),
        optimizer,
        devices=plan.devices,
        bn_mode=config.bn_mode,
        update=(towerlib.Replicated(pack_bytes=config.gradient_pack_bytes)
                if config.variable_update == "replicated"
                else towerlib.ParameterServer(device=config.param_device or "cpu")),
        precision=(towerlib.Float16(loss_scale=config.resolved_loss_scale() or "dynamic")
                   if config.compute_dtype == "float16" else config.compute_dtype),
        exchange=(config.sync_transport or None
                  if config.bn_mode == "sync" or config.variable_update == "replicated"
                  else None),
        accumulation_steps=config.accumulation_steps,
        global_step=global_step,
        ema_decay=config.ema_decay,
        learning_rate=learning_rate,
    )
    return train_graph, learning_rate


def build_replica_training(plan: TrainPlan):
    """Builds this worker's synchronous training step in the default graph.

    Variables go to the ps tasks (ParameterServerPlacer, by byte size); the input (this
    worker's shard), the towers and the tower-gradient sum run on this worker; the
    workers' gradients are averaged by towerlib.cluster's SyncReplicas optimizer.

    Returns:
      (towerlib.cluster.SyncTrainGraph, learning-rate tensor).
    """
    config = plan.config
    cluster = plan.cluster
    if config.seed is not None:
        # The chief (replica 0), which initializes the weights, keeps the seed; the other
        # workers draw other augmentations for their examples.
        tf.compat.v1.set_random_seed(config.seed + cluster.replica_index)
    placer = cluster_lib.ParameterServerPlacer(cluster)
    with tf.compat.v1.device(placer):
        global_step, inputs, learning_rate, optimizer = _inputs_and_optimizer(plan)
    sync_graph = cluster_lib.build_sync_train_graph(
        config.make_model(),
        inputs,
        optimizer,
        cluster,
        num_towers=config.num_towers or None,
        device_type=config.device_type,
        bn_mode=config.bn_mode,
        ema_decay=config.ema_decay,
        precision=config.compute_dtype,
        accumulation_steps=config.accumulation_steps,
        device_function=placer,
        global_step=global_step,
        learning_rate=learning_rate,
    )
    return sync_graph, learning_rate


def checkpoint_step(train_dir: str) -> int:
    """The global step of the newest restorable checkpoint in train_dir (the one
    run_training restores, a torn newer one skipped), or 0 when there is none."""
    checkpoint = run_errors.restorable_checkpoint(train_dir)
    if not checkpoint:
        return 0
    return int(tf.train.load_variable(checkpoint, "global_step"))



def _loop_settings(plan: TrainPlan) -> dict:
    """The settings of the training loop, the same on one machine and on a cluster.

    examples_per_step is the global batch in a cluster too: the throughput logged is the
    whole cluster's, one step being one global batch.
    """
    config = plan.config
    return dict(
        train_dir=config.train_dir,
        max_steps=plan.max_steps,
        log_every_n_steps=config.log_every_n_steps,
        save_checkpoint_steps=config.save_checkpoint_steps,
        save_summaries_steps=config.save_summaries_steps,
        examples_per_step=config.global_batch_size,
    )


def _run_one_machine(plan: TrainPlan, restore_from: Optional[str]):
    train_graph, _ = build_training(plan)
    run_folder.check_checkpoint_fits_graph(restore_from, plan.config.train_dir)
    run_folder.record(plan.config, plan.data_dir, plan.max_steps)  # every check passed
    return towerlib.run_training(
        train_graph,
        session_config=towerlib.session_config(len(plan.devices)),
        **_loop_settings(plan),
    )


def _run_replica(plan: TrainPlan, startup_timeout_secs: float, restore_from):
    sync_graph, _ = build_replica_training(plan)
    if plan.is_chief:
        run_folder.check_checkpoint_fits_graph(restore_from, plan.config.train_dir)
        run_folder.record(plan.config, plan.data_dir, plan.max_steps)
    server = cluster_lib.start_server(plan.cluster, len(plan.devices))
    return cluster_lib.run_distributed_training(
        sync_graph,
        server,
        startup_timeout_secs=startup_timeout_secs,
        **_loop_settings(plan),
    )


def train(
    config: config_lib.TrainConfig,
    cluster: Optional[cluster_lib.ClusterInfo] = None,
    startup_timeout_secs: float = 600.0,
    overwrite_train_dir: bool = False,
) -> TrainResult:
    """Runs (or resumes) training as ``config`` says; returns where it stopped.

    Args:
      config: the run's settings.
      cluster: this worker's task in a cluster (serve_parameters runs a ps task); None to
        train on this machine only.
      startup_timeout_secs: in a cluster, how long to wait for the ps tasks to answer and,
        on a worker other than the chief, for the chief to initialize the model.
      overwrite_train_dir: delete the run in train_dir (if any) and start over, instead
        of refusing flags that describe another run.

    train_config.json is written only once every check passed, the graph built and the
    checkpoint to restore found to fit it (run_folder).
    """
    plan = make_plan(config, cluster, overwrite_train_dir)
    if plan.is_chief and overwrite_train_dir:
        run_folder.start_over(config.train_dir)
    logger.info(describe(plan))
    # Only the chief restores; another worker's train_dir may not even be the chief's.
    restore_from = (
        run_errors.restorable_checkpoint(config.train_dir) if plan.is_chief else None
    )
    start_step = (
        int(tf.train.load_variable(restore_from, "global_step")) if restore_from else 0
    )
    if start_step:
        logger.info(
            "Resuming from the checkpoint in %s at global step %d.",
            config.train_dir,
            start_step,
        )
    if start_step >= plan.max_steps:
        if cluster is not None:
            raise config_lib.ConfigError(
                "The checkpoint in --train_dir=%r is at global step %d, and --max_steps "
                "(or --train_epochs) asks to stop at %d: nothing to train. In a cluster "
                "the chief cannot just skip training, the ps and the other workers would "
                "wait for it. Fix: raise --max_steps to continue the run, or use a new "
                "--train_dir; stop the other tasks (they give up after "
                "--startup_timeout_secs / --ps_timeout_secs)."
                % (config.train_dir, start_step, plan.max_steps)
            )
        logger.info(
            "Global step %d has reached the last step %d: nothing to train.",
            start_step,
            plan.max_steps,
        )
        return TrainResult(start_step, start_step, None, 0.0, plan)

    with tf.Graph().as_default(), run_errors.one_line_errors(config.train_dir):
        start = time.time()
        if cluster is None:
            global_step, loss = _run_one_machine(plan, restore_from)
        else:
            global_step, loss = _run_replica(plan, startup_timeout_secs, restore_from)
        seconds = time.time() - start
    end_step = global_step if global_step is not None else start_step
    logger.info(
        "Trained from global step %d to %d in %.1f s (%.1f examples/sec overall, "
        "graph start-up included); %s.",
        start_step,
        end_step,
        seconds,
        (end_step - start_step) * config.global_batch_size / max(seconds, 1e-9),
        "checkpoints in %s" % config.train_dir
        if plan.is_chief
        else "the chief writes the checkpoints",
    )
    return TrainResult(
        end_step, start_step, None if loss is None else float(loss), seconds, plan
    )


def serve_parameters(
    cluster: cluster_lib.ClusterInfo, timeout_secs: Optional[float] = None
):
    """Runs a ps task: serves its share of the variables until every worker is done.

    Raises:
      TimeoutError: the workers did not all finish within timeout_secs (None: no limit).
    """
    logger.info(
        "ps task %d of %d at %s: serving variables until the %d workers are done%s.",
        cluster.task_index,
        cluster.num_ps,
        cluster.jobs[cluster.job_name][cluster.task_index],
        cluster.num_replicas,
        " (at most %g s)" % timeout_secs if timeout_secs else "",
    )
    cluster_lib.run_parameter_server(cluster, timeout_secs=timeout_secs)
    logger.info("ps task %d: every worker is done, exiting.", cluster.task_index)


def main(argv):
    flags = options.FLAGS

    def body():
        cluster = options.cluster_from_flags()
        config = options.train_config_from_flags()
        if cluster is not None and cluster.is_ps:
            config_lib.check_variable_update_for_cluster(config)
            serve_parameters(cluster, flags.ps_timeout_secs or None)
        else:
            train(
                config, cluster, flags.startup_timeout_secs, flags.overwrite_train_dir
            )

    script_runner.run(argv, body)


if __name__ == "__main__":
    from absl import app
    from absl import flags as absl_flags

    options.define_train_flags()
    options.define_cluster_flags()
    absl_flags.adopt_module_key_flags(options)  # list them in --help
    app.run(main)
