"""A digest of each fixed-seed run's final checkpoint: the same code gives the same lines.

    python bench/final_checkpoints.py --out=/tmp/digests.txt
    python bench/final_checkpoints.py --only=workers2        # a subset, by substring

Guards a refactor that must change no number: run it before and after, and
diff the two outputs. Each configuration trains a small fixed-seed model for
STEPS steps with towerlib.run_training into a fresh temporary folder, then
prints one line:

    <configuration> <sha256> <variables>

the SHA-256 over every variable of the final checkpoint (names sorted; each
name, dtype, shape and the value's raw bytes, from tf.train.load_checkpoint)
and how many variables it holds. --per_variable adds one line per variable
(its own digest), to find which one moved when a line differs.

Configurations, all on 2 virtual CPU towers per process:
- every bn_mode x ParameterServer() / Replicated(): a small convnet with
  towerlib.batch_norm, Momentum, a global batch of 13 (uneven over the towers);
- accumulation (accumulation_steps=2) and BFloat16() precision (sync, Replicated);
- a tf_keras model through towerlib.KerasTower, Replicated;
- across 2 workers (workers2/<bn_mode>): `towerlib-launch --workers 2` runs
  examples/distributed/train.py with --batch_norm --variable_update=replicated
  (all-reduce over 2 x 2 towers, a global batch of 14: uneven over the 4); the
  chief's final checkpoint is digested.

Each single-process configuration runs in this process, in its own graph, its
random ops seeded by towerlib.seed_everything and its data fixed NumPy arrays
in order; each cluster is one launcher process under a timeout, its process
group killed at the end. Not a test of speed: the lines are the result.
"""

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from towerlib import layers  # noqa: E402

flags.DEFINE_string("only", "", "Run only the configurations whose name contains this.")
flags.DEFINE_string("out", "", "Also write the lines to this file.")
flags.DEFINE_bool("per_variable", False, "Also print each variable's own digest.")
flags.DEFINE_float("cluster_timeout_secs", 180.0,
                   "Bound on each 2-worker configuration's launcher process.")
FLAGS = flags.FLAGS

SEED = 1234
STEPS = 4
TOWERS = 2
GLOBAL_BATCH = 13          # 7 + 6 over the 2 towers
CLASSES = 5
BN_MODES = ("first_tower", "all_towers", "sync")
UPDATES = {"parameter_server": towerlib.ParameterServer, "replicated": towerlib.Replicated}
EXAMPLE = os.path.join(REPO_ROOT, "examples", "distributed", "train.py")


def data():
    """STEPS global batches, in order: images [STEPS * B, 8, 8, 3], labels [STEPS * B]."""
    rng = np.random.RandomState(SEED)
    labels = rng.randint(0, CLASSES, STEPS * GLOBAL_BATCH).astype(np.int32)
    images = rng.randn(STEPS * GLOBAL_BATCH, 8, 8, 3) + labels[:, None, None, None] / 3.0
    return images.astype(np.float32), labels


def convnet(inputs, ctx):
    """conv -> towerlib.batch_norm -> relu -> conv -> batch_norm -> pool -> dense."""
    images, labels = inputs
    h = layers.conv2d(images, 8, 3, name="conv1", use_bias=False, weight_decay=1e-4)
    h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn1", momentum=0.8))
    h = layers.conv2d(h, 8, 3, name="conv2", use_bias=False)
    h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn2", momentum=0.8))
    logits = layers.dense(layers.global_avg_pool2d(h), CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def keras_tower():
    """The convnet's first half as a tf_keras model, through towerlib.KerasTower."""
    import tf_keras

    def build():
        inputs = tf_keras.Input((8, 8, 3))
        h = tf_keras.layers.Conv2D(8, 3, use_bias=False, name="conv1")(inputs)
        h = tf_keras.layers.BatchNormalization(momentum=0.8, name="bn1")(h)
        h = tf_keras.layers.GlobalAveragePooling2D()(tf_keras.layers.ReLU()(h))
        return tf_keras.Model(inputs, tf_keras.layers.Dense(CLASSES, name="logits")(h))

    def loss(labels, logits):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    return towerlib.KerasTower(build, loss)


def local_configurations():
    """name -> build_train_graph's tower and options, for the one-process runs."""
    configs = {}
    for bn_mode in BN_MODES:
        for update in UPDATES:
            configs[f"{bn_mode}/{update}"] = dict(bn_mode=bn_mode, update=update)
    configs["sync/replicated/accumulation2"] = dict(
        bn_mode="sync", update="replicated", accumulation_steps=2)
    configs["sync/replicated/bfloat16"] = dict(
        bn_mode="sync", update="replicated", precision=towerlib.BFloat16())
    configs["keras/sync/replicated"] = dict(bn_mode="sync", update="replicated", keras=True)
    return configs


def train_one_process(options, train_dir):
    """Trains STEPS steps of one configuration into train_dir (run_training's checkpoints)."""
    options = dict(options)
    keras = options.pop("keras", False)
    update = UPDATES[options.pop("update")]()
    if keras:
        import tf_keras
        tf_keras.backend.clear_session()   # the same layer names whatever ran before
    with tf.Graph().as_default():
        towerlib.seed_everything(SEED)
        images, labels = data()
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH)
        ).get_next()
        train = towerlib.build_train_graph(
            keras_tower() if keras else convnet, batch,
            tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), num_towers=TOWERS,
            device_type="cpu", update=update, summaries=False, **options)
        towerlib.run_training(
            train, train_dir=train_dir, max_steps=STEPS,
            session_config=session_config(), log_every_n_steps=1000,
            save_summaries_steps=None, stop_on_signals=())


def session_config():
    """The towers' virtual CPUs, ops run one at a time: no order of arrival can differ."""
    config = towerlib.session_config(TOWERS)
    config.inter_op_parallelism_threads = 1
    return config


def train_two_workers(bn_mode, train_dir):
    """2 workers x 2 towers all-reducing (examples/distributed/train.py), by the launcher."""
    command = [sys.executable, "-m", "towerlib.launch", "--workers", "2", "--",
               sys.executable, EXAMPLE, "--batch_norm", f"--bn_mode={bn_mode}",
               "--variable_update=replicated", f"--num_towers={TOWERS}",
               "--device_type=cpu", f"--max_steps={STEPS}", "--global_batch_size=14",
               f"--seed={SEED}", f"--train_dir={train_dir}", "--log_every_n_steps=1000",
               "--startup_timeout_secs=60", "--step_deadline_secs=60"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    env.pop("TF_CONFIG", None)
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, text=True)
    try:
        output, _ = process.communicate(timeout=FLAGS.cluster_timeout_secs)
    except subprocess.TimeoutExpired:
        kill_group(process)
        output, _ = process.communicate()
        raise RuntimeError(f"2 workers ({bn_mode}) did not finish within "
                           f"{FLAGS.cluster_timeout_secs:.0f} s:\n{output[-3000:]}") from None
    finally:
        kill_group(process)
    if process.returncode != 0:
        raise RuntimeError(f"2 workers ({bn_mode}) exited {process.returncode}:\n"
                           f"{output[-3000:]}")


def kill_group(process):
    """Stops the launcher's process group (its tasks die with it), whatever is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
    try:   # a task that outlived the launcher, in its group
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def checkpoint_digest(train_dir):
    """(sha256 hex over every variable, {name: its own sha256}) of train_dir's newest checkpoint."""
    path = tf.train.latest_checkpoint(train_dir)
    if path is None:
        raise RuntimeError(f"no checkpoint in {train_dir}")
    reader = tf.train.load_checkpoint(path)
    whole, each = hashlib.sha256(), {}
    for name in sorted(reader.get_variable_to_shape_map()):
        value = np.asarray(reader.get_tensor(name))
        header = f"{name}|{value.dtype.str}|{value.shape}|".encode()
        body = value.tobytes() if value.dtype != object else repr(value.tolist()).encode()
        whole.update(header + body)
        each[name] = hashlib.sha256(header + body).hexdigest()
    return whole.hexdigest(), each


def configurations():
    """name -> a function of train_dir that trains that configuration into it."""
    runs = {name: (lambda d, o=options: train_one_process(o, d))
            for name, options in local_configurations().items()}
    for bn_mode in BN_MODES:
        runs[f"workers2/{bn_mode}/replicated"] = (
            lambda d, b=bn_mode: train_two_workers(b, d))
    return runs


def main(argv):
    del argv
    chosen = {name: run for name, run in configurations().items() if FLAGS.only in name}
    if not chosen:
        sys.stderr.write(f"error: --only={FLAGS.only!r} matches no configuration. Fix: a "
                         f"substring of one of {', '.join(configurations())}.\n")
        sys.exit(2)
    lines, started = [], time.monotonic()
    for name, run in chosen.items():
        with tempfile.TemporaryDirectory(prefix="final_checkpoints_") as train_dir:
            run(train_dir)
            digest, each = checkpoint_digest(train_dir)
        lines.append(f"{name} {digest} {len(each)}")
        print(lines[-1], flush=True)
        if FLAGS.per_variable:
            for variable, variable_digest in each.items():
                print(f"  {variable} {variable_digest}", flush=True)
    if FLAGS.out:
        with open(FLAGS.out + ".partial", "w", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
        os.replace(FLAGS.out + ".partial", FLAGS.out)   # whole or not at all
    print(f"# {len(lines)} configurations in {time.monotonic() - started:.0f} s",
          file=sys.stderr)


if __name__ == "__main__":
    app.run(main)
