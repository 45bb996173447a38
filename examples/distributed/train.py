r"""Synchronous multi-worker training of a small convnet with towerlib.

Every process runs this script. One machine, one ps and two workers, two
virtual CPU towers each (start the chief, worker 0, first or together):

  python examples/distributed/train.py --job_name=ps --task_index=0 \
      --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224
  python examples/distributed/train.py --job_name=worker --task_index=0 \
      --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224 \
      --num_towers=2 --train_dir=/tmp/dist_train
  python examples/distributed/train.py --job_name=worker --task_index=1 \
      --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224 \
      --num_towers=2 --train_dir=/tmp/dist_train

All-reduce across the workers instead of a ps: no --ps_hosts, and
--variable_update=replicated on every worker:

  python examples/distributed/train.py --job_name=worker --task_index=0 \
      --worker_hosts=127.0.0.1:2223,127.0.0.1:2224 --variable_update=replicated \
      --num_towers=2 --train_dir=/tmp/allreduce_train
  (and --task_index=1 likewise)

Without cluster flags (and without TF_CONFIG) it trains in one process on
--num_towers towers: the same global batches, the same updates.

The data is synthetic: a fixed table of --num_examples random 8x8x3 images
with labels. By default (--data_order=global_batches) the global batch of a
step is towerlib.global_batch_input's: each epoch a permutation of the table
fixed by --seed, worker r of R reading its contiguous slice of each global
batch; its position is in every checkpoint, so --num_towers and the number of
workers may change between two runs on one --train_dir. Through ps tasks (whose
variables every worker shares) and with --data_order=rows_by_step, step s uses
rows (s * B + j) mod N for j < B = --global_batch_size, replica r its share.
Either way any cluster layout sees the same global batch per step.

To try a lost host (towerlib-launch --workers MIN:MAX), --exit_host_lost_at=1:10
makes worker 1 end its process with status 69 right after global step 10:

  towerlib-launch --workers 1:2 --max_restarts 2 -- python \
      examples/distributed/train.py --variable_update=replicated \
      --exit_host_lost_at=1:10 --train_dir=/tmp/elastic_train
"""

import os
import time

# TensorFlow's C++ log level, set before TensorFlow loads, as the CIFAR-10 example does
# (examples/cifar10/quiet_tensorflow.py): 3 without an NVIDIA driver (the failed cuInit
# every CPU process logs is an error line), else 2 (warnings such as "Local rendezvous is
# aborting" when a worker ends, and INFO). A level the user set is kept (0 shows all).
os.environ.setdefault(
    "TF_CPP_MIN_LOG_LEVEL", "2" if os.path.exists("/proc/driver/nvidia/version") else "3")

import sys  # noqa: E402

from absl import (
    app,  # noqa: E402
    flags,  # noqa: E402
)

FLAGS = flags.FLAGS

flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the ps tasks.")
flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the workers.")
flags.DEFINE_string("job_name", "", "'ps' or 'worker'; empty for one machine.")
flags.DEFINE_integer("task_index", 0, "This task's index within its job.")
flags.DEFINE_integer("num_towers", 2, "Towers (GPUs or virtual CPUs) per worker.")
flags.DEFINE_string("device_type", None, "'cpu', 'gpu', or unset for GPUs when present.")
flags.DEFINE_integer("global_batch_size", 16, "Examples per step over all workers.")
flags.DEFINE_integer("num_examples", 256, "Size of the synthetic data table.")
flags.DEFINE_integer("max_steps", 20, "Global step to stop at.")
flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate.")
flags.DEFINE_bool("batch_norm", False, "Add batch norm after the convolution.")
flags.DEFINE_string("bn_mode", "first_tower",
                    "'first_tower', 'all_towers' or 'sync' (sync: on one machine, or "
                    "across workers with --variable_update=replicated).")
flags.DEFINE_enum("variable_update", "parameter_server", ["parameter_server", "replicated"],
                  "'replicated': a copy per tower, gradients all-reduced (in a cluster: "
                  "across every worker's towers, no ps task). 'parameter_server': "
                  "variables on the ps tasks (--ps_hosts).")
flags.DEFINE_string("train_dir", "/tmp/towerlib_distributed", "Checkpoints and events.")
flags.DEFINE_integer("save_checkpoint_steps", 100, "Checkpoint every this many steps.")
flags.DEFINE_integer("log_every_n_steps", 1, "Log every this many steps.")
flags.DEFINE_integer("seed", 0, "Seed of the data table and of its order.")
flags.DEFINE_enum("data_order", "global_batches", ["global_batches", "rows_by_step"],
                  "'global_batches': towerlib.global_batch_input, a shuffled order whose "
                  "position checkpoints hold (not through ps tasks, which always use "
                  "'rows_by_step': rows s*B..s*B+B-1 of the table at step s).")
flags.DEFINE_float("sleep_secs_per_step", 0.0,
                   "Pause after each step, to watch (or kill and restart) a run.")
flags.DEFINE_float("ps_timeout_secs", 0.0,
                   "A ps gives up after this long (0: waits for every worker).")
flags.DEFINE_float("startup_timeout_secs", 600.0,
                   "A worker gives up if the ps tasks do not answer (or, for a "
                   "non-chief, the chief has not initialized the model) within this long.")
flags.DEFINE_float("step_deadline_secs", 300.0,
                   "Bound on one synchronous step: a worker lost for good makes the "
                   "others stop after this long, with one line naming it.")
flags.DEFINE_float("ps_restart_timeout_secs", 300.0,
                   "A worker whose ps task stopped answering during training waits "
                   "this long for it to restart, then fails naming the ps task.")
flags.DEFINE_string("exit_host_lost_at", "",
                    "WORKER:STEP, to try a lost host: worker WORKER (0 on one machine) "
                    "ends its process with status 69 (towerlib.launch.HOST_LOST) right "
                    "after global step STEP, saving nothing, as a task whose host is "
                    "gone; a run resumed past STEP goes on. Empty: never.")

HOST_LOST = 69   # towerlib.launch.HOST_LOST; this module imports no towerlib before the flags


def _host_lost_rule(text):
    """'1:10' -> (1, 10); '' -> None. Raises ValueError naming the fix."""
    if not text:
        return None
    worker, _, step = text.partition(":")
    if not (worker.isdigit() and step.isdigit() and int(step) >= 1):
        raise ValueError("give WORKER:STEP, a worker index >= 0 and a global step >= 1, "
                         "e.g. --exit_host_lost_at=1:10")
    return int(worker), int(step)


def _checked(check, message):
    """An absl validator: check(value) true, else one line with `message`."""
    def validate(value):
        try:
            return bool(check(value))
        except (TypeError, ValueError):
            return False
    return validate, message


flags.register_validator(
    "learning_rate", *_checked(lambda rate: 0 < rate < float("inf"),
                               "the learning rate must be a finite number > 0 (a "
                               "negative rate climbs the loss). Fix: e.g. "
                               "--learning_rate=0.1"))
flags.register_validator(
    "seed", *_checked(lambda seed: 0 <= seed < 2**32,
                      "the seed must be an integer in 0..4294967295 (numpy's range). "
                      "Fix: e.g. --seed=0"))
flags.register_validator(
    "exit_host_lost_at", *_checked(lambda text: _host_lost_rule(text) or True,
                                   "give WORKER:STEP, a worker index >= 0 and a global "
                                   "step >= 1, e.g. --exit_host_lost_at=1:10"))


if __name__ == "__main__":
    # --help answers and a bad flag is one line (exit 2) here, before TensorFlow loads.
    app.define_help_flags()
    try:
        FLAGS(sys.argv)
    except flags.Error as error:
        text = str(error).strip().replace(" ?", "?")
        sys.stderr.write(f"error: {text}{'' if text[-1:] in '.?' else '.'} See "
                         "--helpshort for the flags.\n")
        sys.exit(2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from towerlib import cluster as cluster_lib  # noqa: E402
from towerlib import layers  # noqa: E402

NUM_CLASSES = 10
IMAGE_SHAPE = (8, 8, 3)


def model(inputs, ctx):
    """[n, 8, 8, 3] images, [n] int labels -> mean cross-entropy over the n."""
    images, labels = inputs
    h = layers.conv2d(
        images, 8, 3, name="conv1", use_bias=not FLAGS.batch_norm,
        kernel_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=1))
    if FLAGS.batch_norm:
        h = towerlib.batch_norm(h, ctx, name="bn1", momentum=0.9)
    h = layers.max_pool2d(tf.nn.relu(h), 2, 2)
    logits = layers.dense(
        layers.flatten(h), NUM_CLASSES, name="logits",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def data_table():
    """(images [N, 8, 8, 3] float32, labels [N] int32) as numpy arrays, fixed by --seed."""
    rng = np.random.RandomState(FLAGS.seed)
    return (rng.normal(size=(FLAGS.num_examples,) + IMAGE_SHAPE).astype(np.float32),
            rng.randint(0, NUM_CLASSES, size=FLAGS.num_examples).astype(np.int32))


def global_batches(workers=None):
    """This worker's slice of each step's global batch (towerlib.global_batch_input)."""
    return towerlib.global_batch_input(data_table(), FLAGS.global_batch_size,
                                       seed=FLAGS.seed, workers=workers)


def replica_batch(global_step, replica_index, num_replicas):
    """This replica's rows of step `global_step`'s global batch.

    Returns (images [n_r, 8, 8, 3] float32, labels [n_r] int32), where n_r is
    replica r's share of the global batch (shares differ by at most one).
    """
    images, labels = data_table()
    table_images, table_labels = tf.constant(images), tf.constant(labels)
    # The first B mod R replicas get one example more, as towerlib splits over towers.
    base, extra = divmod(FLAGS.global_batch_size, num_replicas)
    sizes = [base + (1 if r < extra else 0) for r in range(num_replicas)]
    start = sum(sizes[:replica_index])
    offsets = np.arange(start, start + sizes[replica_index], dtype=np.int64)
    rows = (tf.cast(global_step, tf.int64) * FLAGS.global_batch_size + offsets) \
        % FLAGS.num_examples
    return tf.gather(table_images, rows), tf.gather(table_labels, rows)


class PauseHook(tf.compat.v1.train.SessionRunHook):
    """Sleeps after every step, so a person (or a test) can act mid-run."""

    def __init__(self, seconds):
        self.seconds = seconds

    def after_run(self, run_context, run_values):
        time.sleep(self.seconds)


class HostLostHook(tf.compat.v1.train.SessionRunHook):
    """--exit_host_lost_at: ends the process with status 69 right after global step
    `at_step` (os._exit: nothing saved, nothing closed, as when a host is gone)."""

    def __init__(self, at_step, task):
        self.at_step, self.task = at_step, task
        self.first_step = None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values):
        step = run_context.session.run(self._global_step)
        if self.first_step is None:
            self.first_step = step
        if step >= self.at_step and self.first_step <= self.at_step:
            print(f"{self.task}: exiting {HOST_LOST} after step {step} "
                  f"(--exit_host_lost_at={FLAGS.exit_host_lost_at}), as a task whose "
                  "host is lost: nothing saved.", flush=True)
            sys.stderr.flush()
            os._exit(HOST_LOST)


def extra_hooks(worker_index=0, task="one machine"):
    """The hooks the flags ask for: a pause after each step, a lost host."""
    hooks = [PauseHook(FLAGS.sleep_secs_per_step)] if FLAGS.sleep_secs_per_step > 0 else []
    rule = _host_lost_rule(FLAGS.exit_host_lost_at)
    if rule is not None and rule[0] == worker_index:
        hooks.append(HostLostHook(rule[1], task))
    return hooks


def train_one_machine():
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        batch = (global_batches() if FLAGS.data_order == "global_batches"
                 else replica_batch(global_step, 0, 1))
        train_graph = towerlib.build_train_graph(
            model, batch,
            tf.compat.v1.train.GradientDescentOptimizer(FLAGS.learning_rate),
            devices=towerlib.tower_devices(FLAGS.num_towers, FLAGS.device_type),
            bn_mode=FLAGS.bn_mode, update=FLAGS.variable_update,
            global_step=global_step)
        return towerlib.run_training(
            train_graph, train_dir=FLAGS.train_dir, max_steps=FLAGS.max_steps,
            session_config=towerlib.session_config(FLAGS.num_towers),
            hooks=extra_hooks(), log_every_n_steps=FLAGS.log_every_n_steps,
            save_checkpoint_steps=FLAGS.save_checkpoint_steps,
            examples_per_step=FLAGS.global_batch_size)


def train_replica(cluster):
    """This worker's step, its gradients all-reduced with every worker's
    (--variable_update=replicated) or averaged through the ps tasks."""
    server = cluster_lib.start_server(cluster, FLAGS.num_towers)
    allreduce = FLAGS.variable_update == "replicated"
    with tf.Graph().as_default():
        # Through ps tasks new variables go there; all-reducing, each worker keeps its own.
        placer = None if allreduce else cluster_lib.ParameterServerPlacer(cluster)
        with tf.compat.v1.device(placer or f"{cluster.task_device}/device:CPU:0"):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            if allreduce and FLAGS.data_order == "global_batches":
                inputs = global_batches(cluster.worker_group)
            else:
                inputs = replica_batch(global_step, cluster.replica_index,
                                       cluster.num_replicas)
        graph = cluster_lib.build_sync_train_graph(
            model, inputs,
            tf.compat.v1.train.GradientDescentOptimizer(FLAGS.learning_rate),
            cluster, num_towers=FLAGS.num_towers, device_type=FLAGS.device_type,
            bn_mode=FLAGS.bn_mode, device_function=placer, global_step=global_step,
            update=towerlib.Replicated() if allreduce else towerlib.ParameterServer())
        return cluster_lib.run_distributed_training(
            graph, server, train_dir=FLAGS.train_dir, max_steps=FLAGS.max_steps,
            hooks=extra_hooks(cluster.replica_index, task_name(cluster)), startup_timeout_secs=FLAGS.startup_timeout_secs,
            ps_restart_timeout_secs=FLAGS.ps_restart_timeout_secs,
            step_deadline_secs=FLAGS.step_deadline_secs,
            log_every_n_steps=FLAGS.log_every_n_steps,
            save_checkpoint_steps=FLAGS.save_checkpoint_steps,
            examples_per_step=FLAGS.global_batch_size)


def cluster_mismatch(cluster):
    """One line when --variable_update does not fit the cluster, else None."""
    if FLAGS.variable_update == "replicated" and cluster.num_ps:
        return ("--variable_update=replicated all-reduces across the workers, and "
                "the cluster has ps tasks. Fix: drop --ps_hosts (no ps task), or drop "
                "--variable_update to train through the ps tasks.")
    if FLAGS.variable_update == "parameter_server" and not cluster.num_ps:
        return ("the cluster has no ps task (--ps_hosts), which "
                "--variable_update=parameter_server needs. Fix: give --ps_hosts, or "
                "--variable_update=replicated to all-reduce across the workers.")
    return None


def task_name(cluster):
    """How the error line names this process: 'worker 1', 'ps 0' or 'one machine'."""
    if cluster is None:
        return f"{FLAGS.job_name} {FLAGS.task_index}" if FLAGS.job_name else "one machine"
    return f"{cluster.job_name} {cluster.task_index}"


def run_task(cluster):
    """This process's whole work: one machine, a ps task or a training replica."""
    for name in ("num_examples", "global_batch_size"):
        if FLAGS[name].value < 1:
            raise ValueError(f"--{name}={FLAGS[name].value}: give at least 1.")
    mismatch = cluster_mismatch(cluster) if cluster is not None else None
    if mismatch:
        # Every task refuses, the ps too: it would wait for workers that never come.
        raise ValueError(mismatch)
    if cluster is not None and cluster.is_ps:
        cluster_lib.run_parameter_server(cluster,
                                         timeout_secs=FLAGS.ps_timeout_secs or None)
        print(f"ps task {cluster.task_index}: every worker is done, exiting.", flush=True)
        return
    result = train_one_machine() if cluster is None else train_replica(cluster)
    step, loss = result
    if getattr(result, "nothing_to_train", False):
        print(f"finished: nothing to train, --train_dir={FLAGS.train_dir} is already at "
              f"global step {step}, and --max_steps={FLAGS.max_steps} is the step to stop "
              "at. Fix: a higher --max_steps to continue that run, or another "
              "--train_dir to start afresh.", flush=True)
        return result
    ended = f"stopped by {result.stop_signal}" if result.stop_signal else "finished"
    print(f"{ended}: global_step={step} loss="
          f"{'none' if loss is None else format(loss, '.6f')}", flush=True)
    return result   # a stop signal in it is the exit status


def main(argv):
    """Exits by meaning (towerlib.cluster.exits): 0 done, 2 a mistake in the flags or
    the cluster, 138 a lost task (restart every task), 128 + s a stop signal."""
    del argv
    cluster = None

    def resolved_then_run():
        nonlocal cluster
        cluster = cluster_lib.resolve_cluster(
            FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.job_name, FLAGS.task_index)
        return run_task(cluster)   # a stop signal in its result is the exit status

    cluster_lib.exit_by_meaning(resolved_then_run, task=lambda: task_name(cluster))


if __name__ == "__main__":
    # TensorFlow's logger prints through its own handler and again through absl's (app.run
    # puts it on the root logger): every TensorFlow INFO line twice. absl's alone prints
    # it, in the format of the other lines.
    for handler in list(tf.get_logger().handlers):
        tf.get_logger().removeHandler(handler)
    app.run(main)
