r"""Trains a ResNet on ImageNet-format TFRecord shards, read by index.

On one machine, 2 virtual CPU towers, small generated shards (the quick look):

  python -m examples.imagenet.train --model=resnet_mini --image_size=64 --max_steps=20

On real shards (train-00000-of-01024 ...; their record indices are built on first
use, beside the shards or in --index_dir when that folder is read-only):

  python -m examples.imagenet.train --data_dir=/data/imagenet --num_towers=8 \
      --global_batch_size=256 --train_dir=/tmp/resnet50

Across machines, under towerlib-launch (or Slurm, a TFJob, Ray: any TF_CONFIG), the
workers all-reduce their gradients; the global batch of a step is the same on any
number of workers (towerlib.global_batch_input), so a run may be resumed on another:

  towerlib-launch --workers 2 -- python -m examples.imagenet.train --num_towers=2

The learning rate is 0.1 x B / 256 (B the global batch), momentum 0.9, weight decay
1e-4, held constant: a schedule is towerlib's (docs/large_batches.md), not this lesson's.
"""

import json
import os
import shutil
import tempfile

from absl import app, flags

from examples.imagenet.resnet import DEPTHS

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", "", "A folder of train-* TFRecord shards; empty: "
                    "shards generated into --generated_dir.")
flags.DEFINE_string("index_dir", None, "Where the shards' record indices go "
                    "(default: beside each shard).")
flags.DEFINE_string("generated_dir", "/tmp/towerlib_imagenet_data",
                    "Where generated shards are written when --data_dir is empty.")
flags.DEFINE_integer("generated_records", 512, "Records generated (in 8 shards).")
flags.DEFINE_enum("model", "resnet50", list(DEPTHS), "The network.")
flags.DEFINE_integer("image_size", 224, "Side of the training crops.")
flags.DEFINE_integer("num_towers", 2, "Towers (GPUs, or virtual CPUs) per worker.")
flags.DEFINE_string("device_type", None, "'cpu', 'gpu', or unset for GPUs when present.")
flags.DEFINE_integer("global_batch_size", 32, "Examples per step, whole job.")
flags.DEFINE_float("learning_rate", None, "Default: 0.1 x global_batch_size / 256.")
flags.DEFINE_string("bn_mode", "all_towers", "'first_tower', 'all_towers' or 'sync'.")
flags.DEFINE_integer("max_steps", 100, "Global step to stop at.")
flags.DEFINE_integer("seed", 0, "The initial weights, the order of the examples and "
                     "their crops.")
flags.DEFINE_string("train_dir", "/tmp/towerlib_imagenet", "Checkpoints and events.")
flags.DEFINE_integer("save_checkpoint_steps", 50, "Checkpoint every this many steps.")
flags.DEFINE_integer("log_every_n_steps", 10, "Log every this many steps.")
for _name in ("generated_records", "image_size", "num_towers", "global_batch_size",
              "max_steps"):
    flags.register_validator(_name, lambda value: value >= 1,
                             message=f"--{_name} must be at least 1.")

import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from examples.imagenet import records  # noqa: E402
from examples.imagenet.resnet import ResNet  # noqa: E402
from towerlib import cluster as cluster_lib  # noqa: E402

_MARKER = "generated.json"   # what write_shards was asked for, written after the shards


def generated_shards(folder, num_records, image_size):
    """The generated shards' folder: written once, reused while the request is the same.

    Written whole into a temporary folder beside it, then renamed into place, so that
    workers started together (each may generate) never see half a folder: the first
    rename wins and the others reuse its shards. A folder holding anything else is
    refused: this script replaces only a folder it wrote itself (its marker says so).
    """
    request = {"records": num_records, "image_size": image_size}
    if _generated_request(folder) == request:
        return folder
    if os.path.isdir(folder) and os.listdir(folder) and _generated_request(folder) is None:
        raise ValueError(f"--generated_dir={folder} holds files this script did not "
                         "write. Fix: an empty or new --generated_dir, or --data_dir.")
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=os.path.basename(folder) + ".partial-", dir=parent)
    try:
        records.write_shards(partial, num_records, image_size=image_size)
        with open(os.path.join(partial, _MARKER), "w") as text:
            json.dump(request, text)
        if _generated_request(folder) is not None:   # an earlier request's shards, ours
            shutil.rmtree(folder)
        os.rename(partial, folder)   # fails if another worker's folder got there first
    except OSError:
        if _generated_request(folder) != request:
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _generated_request(folder):
    """What the shards in `folder` were generated for, or None if it holds none of ours."""
    try:
        with open(os.path.join(folder, _MARKER)) as text:
            return json.load(text)
    except (OSError, ValueError):
        return None


def source():
    """The training shards as a towerlib.TFRecords, each record parsed (no pixels)."""
    folder = FLAGS.data_dir or generated_shards(
        FLAGS.generated_dir, FLAGS.generated_records, max(FLAGS.image_size, 32))
    pattern = os.path.join(folder, "train-*")
    if not tf.io.gfile.glob(pattern):
        raise ValueError(f"--data_dir={folder} has no train-* shards. Fix: the folder of "
                         "ImageNet's TFRecord shards (train-00000-of-01024 ...).")
    return towerlib.TFRecords(pattern, decode=records.parse, index_dir=FLAGS.index_dir)


def global_batches(shards, workers=None):
    """This worker's slice of each step's global batch: (images, labels)."""
    return towerlib.global_batch_input(
        shards, FLAGS.global_batch_size, seed=FLAGS.seed, workers=workers,
        augment=records.train_augment(FLAGS.image_size))


def optimizer():
    rate = FLAGS.learning_rate or 0.1 * FLAGS.global_batch_size / 256
    return tf.compat.v1.train.MomentumOptimizer(rate, 0.9)


def train_one_machine(shards):
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(FLAGS.seed)   # the initial weights too
        graph = towerlib.build_train_graph(
            ResNet(FLAGS.model), global_batches(shards), optimizer(),
            devices=towerlib.tower_devices(FLAGS.num_towers, FLAGS.device_type),
            bn_mode=FLAGS.bn_mode, update=towerlib.Replicated())
        return towerlib.run_training(
            graph, train_dir=FLAGS.train_dir, max_steps=FLAGS.max_steps,
            session_config=towerlib.session_config(FLAGS.num_towers),
            log_every_n_steps=FLAGS.log_every_n_steps,
            save_checkpoint_steps=FLAGS.save_checkpoint_steps,
            examples_per_step=FLAGS.global_batch_size)


def train_worker(shards, cluster):
    """This worker's step; gradients all-reduced with every other worker's."""
    if cluster.num_ps:
        raise ValueError("this example all-reduces across the workers and the cluster "
                         "has ps tasks. Fix: a cluster of workers only.")
    server = cluster_lib.start_server(cluster, FLAGS.num_towers)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(FLAGS.seed)   # the chief's weights are broadcast
        with tf.compat.v1.device(f"{cluster.task_device}/device:CPU:0"):
            inputs = global_batches(shards, cluster.worker_group)
        graph = cluster_lib.build_sync_train_graph(
            ResNet(FLAGS.model), inputs, optimizer(), cluster,
            num_towers=FLAGS.num_towers, device_type=FLAGS.device_type,
            bn_mode=FLAGS.bn_mode, update=towerlib.Replicated())
        return cluster_lib.run_distributed_training(
            graph, server, train_dir=FLAGS.train_dir, max_steps=FLAGS.max_steps,
            log_every_n_steps=FLAGS.log_every_n_steps,
            save_checkpoint_steps=FLAGS.save_checkpoint_steps,
            examples_per_step=FLAGS.global_batch_size)


def run():
    cluster = cluster_lib.resolve_cluster()
    shards = source()   # generated (eagerly) and indexed before any graph is built
    result = train_one_machine(shards) if cluster is None else train_worker(shards, cluster)
    step, loss = result
    ended = f"stopped by {result.stop_signal}" if result.stop_signal else "finished"
    print(f"{ended}: global_step={step} loss="
          f"{'none' if loss is None else format(loss, '.6f')}", flush=True)
    return result


def main(argv):
    """Exits by meaning (towerlib.cluster.exits): 0 done, 2 a mistake in the flags or
    the data, 138 a lost worker (restart every worker), 128 + s a stop signal."""
    del argv
    cluster_lib.exit_by_meaning(run, task="imagenet")


if __name__ == "__main__":
    for handler in list(tf.get_logger().handlers):   # absl's handler alone prints
        tf.get_logger().removeHandler(handler)
    app.run(main)
