"""Every bad input the tests try, run once each: what the user gets, first line only.

    python tests/checks/bad_inputs.py            # prints the section of tests/faults_ledger.md
    python tests/checks/bad_inputs.py --write    # puts it in tests/faults_ledger.md
    BAD_INPUTS_TIMES=1 python tests/checks/bad_inputs.py    # and each case's time on stderr

Each case of the library table is a small function that builds its own
tf.Graph (a fresh temporary directory when it needs one) and calls towerlib
with ONE wrong input. The runner records the exception's type and the first
line of its message; a case that raises nothing records towerlib's first
warning (its "towerlib" logger or `warnings`), or, for the few inputs towerlib
answers with an INFO line and no error, that line. A case that gets none of
these passes silently, which the tests call a defect
(tests/checks/test_bad_inputs_table.py, which also checks that tests/faults_ledger.md
holds exactly the section this script prints). The user's page, docs/faults.md, says
what happens and what to do; this table is its evidence.

The example scripts' errors (one line on stderr, exit status 2) are not run
here (each is a fresh Python process of several seconds): the second table
lists the first lines their tests expect.

Paths of the temporary directory print as $TMP, port numbers as $PORT.
"""

import ast
import dataclasses
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from towerlib import cluster as cluster_lib  # noqa: E402
from towerlib import layers  # noqa: E402

# ------------------------------------------------------------------ the cases

@dataclasses.dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
      bad_input: what is wrong, as the table's first column (Markdown).
      where: the call that answers it.
      run: run(tmp) does it, in a fresh default graph; tmp is an empty directory.
      names: words the first line must contain: the option or the problem.
      info: for an input answered by an INFO line and no error, the start of that line.
      defect: why the first line does not say what is wrong, or why nothing is said
        (a known defect, to be fixed in towerlib), or "".
    """

    bad_input: str
    where: str
    run: object
    names: tuple
    info: str = ""
    defect: str = ""


CASES = []


def case(bad_input, where, *names, info="", defect=""):
    def register(run):
        CASES.append(Case(bad_input, where, run, tuple(names), info, defect))
        return run
    return register


BUILD = "`build_train_graph`"
RUN = "`run_training`"
VALIDATE = "`validate_config`"
OWN_SESSION = "`session.run(train.train_op)` in your own `Session`"
CONFIG_HEADER = ("a ConfigError's first line counts its problems but names none; "
                 "the option is on the second line")
GRAPH_EXECUTION = ("TensorFlow 2.21's Session errors begin 'Graph execution error:' and the "
                   "node's stack; the message proper follows several lines below")


def _batch(size=8, features=4):
    rng = np.random.RandomState(0)
    return (tf.constant(rng.randn(size, features).astype(np.float32)),
            tf.constant(rng.randint(0, 3, size).astype(np.int32)))


def _cross_entropy(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def _tower(inputs, ctx):
    """[B, 4] features -> 3 classes."""
    del ctx
    features, labels = inputs
    return _cross_entropy(labels, layers.dense(features, 3, name="logits"))


def _conv_tower(inputs, ctx, bn=False):
    """[B, 6, 6, 2] images -> conv (batch norm) -> 3 classes."""
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    if bn:
        h = towerlib.batch_norm(h, ctx, name="bn1")
    return _cross_entropy(labels, layers.dense(layers.flatten(tf.nn.relu(h)), 3, name="logits"))


def _images(size=8):
    rng = np.random.RandomState(0)
    return (tf.constant(rng.randn(size, 6, 6, 2).astype(np.float32)),
            tf.constant(rng.randint(0, 3, size).astype(np.int32)))


def _sgd():
    return tf.compat.v1.train.GradientDescentOptimizer(0.1)


def _cpus(count):
    return [f"/device:CPU:{i}" for i in range(count)]


def _build(tower=_tower, inputs=None, optimizer=None, **options):
    """build_train_graph on two virtual CPUs (unless `options` say otherwise)."""
    if not {"devices", "num_towers", "device_type"} & set(options):
        options["devices"] = _cpus(2)
    return towerlib.build_train_graph(
        tower, _batch() if inputs is None else inputs,
        _sgd() if optimizer is None else optimizer, **options)


def _session_config(num_towers=2):
    config = towerlib.session_config(num_towers)
    config.intra_op_parallelism_threads = 1
    config.inter_op_parallelism_threads = 2
    return config


def _train(tmp, train, **options):
    options.setdefault("max_steps", 1)
    options.setdefault("session_config", _session_config(2))
    options.setdefault("save_summaries_steps", None)
    options.setdefault("stop_on_signals", ())
    return towerlib.run_training(train, train_dir=os.path.join(tmp, "train"), **options)


def _session(train, num_towers=2):
    session = tf.compat.v1.Session(config=_session_config(num_towers))
    train.initialize(session)
    return session


# --- build_train_graph: one option wrong -----------------------------------------

case("`num_towers=0`", BUILD, "num_towers")(lambda tmp: _build(num_towers=0))
case("`num_towers=2.0`", BUILD, "num_towers")(lambda tmp: _build(num_towers=2.0))
case("`num_towers=3` with 2 `devices`", BUILD, "num_towers=3", "2 devices")(
    lambda tmp: _build(num_towers=3, devices=_cpus(2)))
case("`devices` with a duplicate (`/device:CPU:0`, `/cpu:0`)", BUILD, "/cpu:0")(
    lambda tmp: _build(devices=["/device:CPU:0", "/cpu:0"]))
case("`devices='/gpu:0'` (a string, not a list)", BUILD, "devices")(
    lambda tmp: _build(devices="/gpu:0"))
case("`device_type='tpu'`", BUILD, "device_type")(
    lambda tmp: _build(num_towers=2, device_type="tpu"))
case("`device_type='gpu'` on a machine without GPUs", BUILD, "GPU")(
    lambda tmp: _build(num_towers=2, device_type="gpu"))
case("`bn_mode='every_tower'` (a typo)", BUILD, "bn_mode", "every_tower")(
    lambda tmp: _build(bn_mode="every_tower"))
case("`update='mirrored'`", BUILD, "update", "mirrored")(
    lambda tmp: _build(update="mirrored"))
case("`precision='half'`", BUILD, "half")(lambda tmp: _build(precision="half"))
case("`precision='float64'`", BUILD, "float64")(lambda tmp: _build(precision="float64"))
case("`exchange='nccl'`", BUILD, "exchange", "nccl")(lambda tmp: _build(exchange="nccl"))
case("`exchange=GraphExchange()` where nothing is exchanged (`first_tower`, parameter "
     "server)", BUILD, "exchange", "no effect")(
    lambda tmp: _build(exchange=towerlib.GraphExchange()))
case("`exchange=CollectiveExchange()` with `all_towers` and a parameter server", BUILD,
     "exchange", "no effect")(
    lambda tmp: _build(exchange=towerlib.CollectiveExchange(), bn_mode="all_towers"))
case("`accumulation_steps=2.5`", BUILD, "accumulation_steps")(
    lambda tmp: _build(accumulation_steps=2.5))
case("`accumulation_steps=0`", BUILD, "accumulation_steps")(
    lambda tmp: _build(accumulation_steps=0))
case("global batch 5 < `accumulation_steps=3` x 2 towers", BUILD, "3 x 2 = 6")(
    lambda tmp: _build(inputs=_batch(5), accumulation_steps=3))
case("`global_step='step'`", BUILD, "global_step")(lambda tmp: _build(global_step="step"))
case("`ema_decay=1.5`", BUILD, "ema_decay")(lambda tmp: _build(ema_decay=1.5))
case("`learning_rate=-0.1`", BUILD, "learning_rate")(lambda tmp: _build(learning_rate=-0.1))
case("`var_list='logits/weights'` (a name, not variables)", BUILD, "var_list")(
    lambda tmp: _build(var_list="logits/weights"))
case("`summaries='yes'`", BUILD, "summaries")(lambda tmp: _build(summaries="yes"))
case("`check_isolation=1`", BUILD, "check_isolation")(lambda tmp: _build(check_isolation=1))
case("`optimizer='sgd'` (a string)", BUILD, "optimizer")(lambda tmp: _build(optimizer="sgd"))
case("`optimizer` a Keras optimizer (`tf.keras.optimizers.SGD`)", BUILD, "optimizer")(
    lambda tmp: _build(optimizer=tf.keras.optimizers.SGD(0.1)))
case("`tower_fn='not a function'`", BUILD, "tower_fn")(
    lambda tmp: _build(tower="not a function"))
case("`precision='float16'` with `guard_numerics(..., check_gradients=True)`", BUILD,
     "check_gradients")(
    lambda tmp: _build(precision="float16",
                       optimizer=towerlib.guard_numerics(_sgd(), check_gradients=True)))

# --- the strategy objects -----------------------------------------------------

for _scale in (-1, 0, 1e-30, math.inf, math.nan, "dynamc", True):
    case(f"`towerlib.Float16(loss_scale={_scale!r})`", "`Float16(...)`", "loss_scale")(
        lambda tmp, scale=_scale: towerlib.Float16(loss_scale=scale))
case("`towerlib.Replicated(pack_bytes=-1)`", "`Replicated(...)`", "pack_bytes")(
    lambda tmp: towerlib.Replicated(pack_bytes=-1))
case("`towerlib.Replicated(wire_dtype='float64')`", "`Replicated(...)`", "wire_dtype")(
    lambda tmp: towerlib.Replicated(wire_dtype="float64"))
case("`towerlib.ParameterServer(device='tpu')`", "`ParameterServer(...)`", "device='tpu'")(
    lambda tmp: towerlib.ParameterServer(device="tpu"))
case("`towerlib.CollectiveExchange(timeout_seconds=0)`", "`CollectiveExchange(...)`",
     "timeout_seconds")(lambda tmp: towerlib.CollectiveExchange(timeout_seconds=0))
case("`loss_scaling.make_loss_scale('dynamc')`", "`make_loss_scale`", "dynamc")(
    lambda tmp: towerlib.loss_scaling.make_loss_scale("dynamc"))
case("`CosineDecay(100, end_fraction='0.1')` (a string)", "`CosineDecay(...)`",
     "end_fraction='0.1'")(
    lambda tmp: towerlib.schedules.CosineDecay(100, end_fraction="0.1"))
case("`PolynomialDecay(100, power='2')` (a string)", "`PolynomialDecay(...)`", "power='2'")(
    lambda tmp: towerlib.schedules.PolynomialDecay(100, power="2"))
case("`LARSOptimizer(0.1, momentum='0.9')` (a string)", "`LARSOptimizer(...)`",
     "momentum", "'0.9'")(
    lambda tmp: towerlib.optimizers.LARSOptimizer(0.1, momentum="0.9"))
case("`LARSOptimizer(0.1, eta=None)`", "`LARSOptimizer(...)`", "eta", "None")(
    lambda tmp: towerlib.optimizers.LARSOptimizer(0.1, eta=None))
case("`LAMBOptimizer(0.1, beta2='0.999')` (a string)", "`LAMBOptimizer(...)`", "beta2")(
    lambda tmp: towerlib.optimizers.LAMBOptimizer(0.1, beta2="0.999"))


# --- the tower function -------------------------------------------------------

@case("a float64 loss", BUILD, "float64", "loss")
def _float64_loss(tmp):
    def tower(inputs, ctx):
        weights = tf.compat.v1.get_variable("w", [4, 3], dtype=tf.float64)
        return tf.reduce_mean(tf.matmul(tf.cast(inputs[0], tf.float64), weights))
    _build(tower)


case("an int32 loss", BUILD, "int32", "loss")(
    lambda tmp: _build(lambda inputs, ctx: tf.constant(1)))


@case("a loss of one value per example (not a scalar)", BUILD, "scalar")
def _vector_loss(tmp):
    def tower(inputs, ctx):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=inputs[1], logits=layers.dense(inputs[0], 3, name="logits"))
    _build(tower)


@case("a per-example loss of unknown rank", OWN_SESSION, "loss must be a scalar",
      defect=GRAPH_EXECUTION)
def _unknown_rank_loss(tmp):
    def tower(inputs, ctx):
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=inputs[1], logits=layers.dense(inputs[0], 3, name="logits"))
        return tf.compat.v1.placeholder_with_default(per_example, shape=None)
    # One tower: with two, which tower's check fails first varies from run to run.
    train = _build(tower, devices=_cpus(1))
    with _session(train, 1) as session:
        session.run(train.train_op)


case("a loss that is a Python float", BUILD, "tf.Tensor")(
    lambda tmp: _build(lambda inputs, ctx: 1.5))
case("a dict without a `'loss'` entry", BUILD, "'loss'")(
    lambda tmp: _build(lambda inputs, ctx: {"logits": inputs[0]}))


@case("a loss that reads no variable", BUILD, "does not depend", "variables")
def _loss_without_variables(tmp):
    def tower(inputs, ctx):
        tf.compat.v1.get_variable("w", [2, 2])
        return tf.reduce_mean(inputs[0])
    _build(tower)


@case("a tower creating a variable tower 0 did not (`get_variable`)", BUILD,
      "Tower 1", "tower_one_only")
def _later_tower_get_variable(tmp):
    def tower(inputs, ctx):
        if ctx.index == 1:
            tf.compat.v1.get_variable("tower_one_only", [2])
        return _tower(inputs, ctx)
    _build(tower)


@case("a tower creating a `tf.Variable` tower 0 did not", BUILD, "Tower 1",
      "plain_variable")
def _later_tower_tf_variable(tmp):
    def tower(inputs, ctx):
        if ctx.index == 1:
            tf.Variable(1.0, name="plain_variable")
        return _tower(inputs, ctx)
    _build(tower)


@case("a model class instead of an instance", BUILD, "Net()")
def _model_class(tmp):
    class Net(towerlib.TowerModel):
        def build(self, inputs, ctx):
            return _tower(inputs, ctx)
    _build(Net)


@case("a per-tower batch size hard-coded in the tower (TF 1 tutorial's `batch_size=16`)",
      BUILD, "Tower 0 got 4 examples")
def _hard_coded_batch(tmp):
    def tower(inputs, ctx):
        images, labels = inputs
        h = layers.conv2d(images, 4, 3, name="conv1")
        h = tf.reshape(h, [16, -1])  # the tutorial's reshape to its --batch_size
        return _cross_entropy(labels, layers.dense(h, 3, name="logits"))
    _build(tower, inputs=_images(16), devices=_cpus(4))


@case("a reshape to the global batch that TensorFlow accepts", BUILD,
      "Tower 0 got 4 examples")
def _reshape_to_global_batch(tmp):
    def tower(inputs, ctx):
        rows = tf.reshape(inputs[0], [8, -1])  # 4 examples spread over 8 rows
        return tf.reduce_mean(tf.matmul(rows, tf.compat.v1.get_variable("w", [36, 1])))
    _build(tower, inputs=_images(8))


@case("a tower loss reading another tower's (an unscoped `get_collection('losses')`)",
      BUILD, "Tower 1's loss", "tower_0")
def _cross_tower_loss(tmp):
    def tower(inputs, ctx):
        features, labels = inputs
        loss = _cross_entropy(labels, layers.dense(features, 3, name="logits"))
        tf.compat.v1.add_to_collection("losses", loss)
        return tf.add_n(tf.compat.v1.get_collection("losses"))  # every tower's so far
    _build(tower)


@case("sync batch-norm layers called in another order by tower 1", BUILD, "differs",
      "'first'")
def _sync_order(tmp):
    def tower(inputs, ctx):
        images, labels = inputs
        h = images
        for name in (["first", "second"] if ctx.index == 0 else ["second", "first"]):
            h = towerlib.batch_norm(h, ctx, name=name)
        return _cross_entropy(labels, layers.dense(layers.flatten(h), 3, name="logits"))
    _build(tower, inputs=_images(), bn_mode="sync")


@case("batch norm in tower 0 only", BUILD, "'bn1'", "towers [0]")
def _batch_norm_in_tower_0_only(tmp):
    _build(lambda inputs, ctx: _conv_tower(inputs, ctx, bn=ctx.index == 0),
           inputs=_images(), bn_mode="all_towers")


def _hand_written_fused_batch_norm(inputs, ctx):
    """TF 1's batch norm written out: fused_batch_norm, its average in UPDATE_OPS."""
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    with tf.compat.v1.variable_scope("my_bn"):
        scale = tf.compat.v1.get_variable("gamma", [4], initializer=tf.ones_initializer())
        offset = tf.compat.v1.get_variable("beta", [4], initializer=tf.zeros_initializer())
        moving_mean = tf.compat.v1.get_variable(
            "moving_mean", [4], initializer=tf.zeros_initializer(), trainable=False)
        h, mean, _ = tf.compat.v1.nn.fused_batch_norm(h, scale, offset, is_training=True)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                       moving_mean.assign(0.9 * moving_mean + 0.1 * mean))
    return _cross_entropy(labels, layers.dense(layers.flatten(h), 3, name="logits"))


case("TF 1 batch norm (`fused_batch_norm` + `UPDATE_OPS`) under `bn_mode='all_towers'`",
     BUILD, "bn_mode='all_towers'", "not towerlib's")(
    lambda tmp: _build(_hand_written_fused_batch_norm, inputs=_images(),
                       bn_mode="all_towers"))


@case("TF 1 batch norm by `tf.nn.moments` under `bn_mode='sync'`", BUILD, "bn_mode='sync'",
      "not towerlib's")
def _hand_written_moments(tmp):
    def tower(inputs, ctx):
        features, labels = inputs
        h = layers.dense(features, 8, name="fc1", use_bias=False)
        with tf.compat.v1.variable_scope("moments_bn"):
            average = tf.compat.v1.get_variable(
                "pop_mean", [8], initializer=tf.zeros_initializer(), trainable=False)
            mean, variance = tf.nn.moments(h, [0])
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                           average.assign(0.9 * average + 0.1 * mean))
            h = tf.nn.batch_normalization(h, mean, variance, None, None, 1e-3)
        return _cross_entropy(labels, layers.dense(h, 3, name="logits"))
    _build(tower, bn_mode="sync")


@case("a variable that does not feed the loss", BUILD, "unused", "no gradient")
def _unused_variable(tmp):
    def tower(inputs, ctx):
        tf.compat.v1.get_variable("unused", [3])
        return _tower(inputs, ctx)
    _build(tower)


case("a tower on `/gpu:7`, which this process lacks (soft placement would hide it)", BUILD,
     "/gpu:7")(lambda tmp: _build(devices=["/gpu:7"]))


# --- the inputs ---------------------------------------------------------------

case("inputs that are NumPy arrays, not tensors", BUILD, "tf.Tensor")(
    lambda tmp: _build(inputs=(np.zeros([8, 4], np.float32), np.zeros([8], np.int32))))
case("inputs with different batch sizes (8 features, 6 labels)", BUILD, "batch")(
    lambda tmp: _build(inputs=(_batch(8)[0], _batch(6)[1])))
case("a global batch of 3 for 4 towers", BUILD, "3 examples", "4 towers")(
    lambda tmp: _build(inputs=_batch(3), devices=_cpus(4)))


@case("a fed global batch of 3 for 4 towers", OWN_SESSION, "smaller than the tower count",
      defect=GRAPH_EXECUTION)
def _fed_batch_too_small(tmp):
    features = tf.compat.v1.placeholder(tf.float32, [None, 4])
    labels = tf.compat.v1.placeholder(tf.int32, [None])
    train = _build(inputs=(features, labels), devices=_cpus(4))
    with _session(train, 4) as session:
        session.run(train.train_op, {features: np.zeros([3, 4]), labels: np.zeros([3])})


@case("fed inputs of different batch sizes (8 features, 6 labels)", OWN_SESSION,
      "different batch dimension", defect=GRAPH_EXECUTION)
def _fed_batch_sizes_differ(tmp):
    features = tf.compat.v1.placeholder(tf.float32, [None, 4])
    labels = tf.compat.v1.placeholder(tf.int32, [None])
    train = _build(inputs=(features, labels))
    with _session(train) as session:
        session.run(train.train_op, {features: np.zeros([8, 4]), labels: np.zeros([6])})


@case("an input function giving tower 1 another structure than tower 0", BUILD,
      "tower 1", "tower 0")
def _input_fn_structures(tmp):
    def input_fn(ctx):
        pair = _batch(4)
        return pair if ctx.index == 0 else pair + (tf.zeros([4]),)
    _build(lambda inputs, ctx: _tower(inputs[:2], ctx), inputs=input_fn)


@case("a fed global batch of 5 for `accumulation_steps=3` x 2 towers", OWN_SESSION,
      "accumulation_steps x towers", defect=GRAPH_EXECUTION)
def _fed_batch_too_small_for_micro_batches(tmp):
    features = tf.compat.v1.placeholder(tf.float32, [None, 4])
    labels = tf.compat.v1.placeholder(tf.int32, [None])
    train = _build(inputs=(features, labels), accumulation_steps=3)
    with _session(train) as session:
        session.run(train.train_op, {features: np.zeros([5, 4]), labels: np.zeros([5])})


def _dataset_batch(examples, batch):
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.zeros([examples, 4]), tf.zeros([examples], tf.int32))).batch(batch)
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


case("an empty dataset", RUN, "input ended before the first step")(
    lambda tmp: _train(tmp, _build(inputs=_dataset_batch(0, 4)), max_steps=3))


@case("an empty dataset", OWN_SESSION, "End of sequence",
      defect=GRAPH_EXECUTION + "; TensorFlow's own OutOfRangeError (run_training raises "
             "a DataError instead)")
def _empty_dataset_own_session(tmp):
    train = _build(inputs=_dataset_batch(0, 4))
    with _session(train) as session:
        session.run(train.train_op)


case("a dataset batch of 3 for `accumulation_steps=2` x 2 towers", RUN,
     "accumulation_steps x towers")(
    lambda tmp: _train(tmp, _build(inputs=_dataset_batch(3, 3), accumulation_steps=2)))


# --- run_training's options ---------------------------------------------------

case("`max_steps=-1`", RUN, "max_steps")(
    lambda tmp: _train(tmp, _build(), max_steps=-1))
case("`train_dir=None`, `max_steps=None`", RUN, "train_dir")(
    lambda tmp: towerlib.run_training(_build(), train_dir=None, max_steps=None))
case("`train_dir='~/runs/a'`", RUN, "train_dir", "expanduser")(
    lambda tmp: towerlib.run_training(_build(), train_dir="~/runs/a", max_steps=1))


@case("`train_dir` a file", RUN, "train_dir")
def _train_dir_a_file(tmp):
    path = os.path.join(tmp, "a_file")
    with open(path, "w") as handle:
        handle.write("not a folder")
    towerlib.run_training(_build(), train_dir=path, max_steps=1, stop_on_signals=())


case("`save_checkpoint_steps=0`", RUN, "save_checkpoint_steps")(
    lambda tmp: _train(tmp, _build(), save_checkpoint_steps=0))
case("both `save_checkpoint_steps` and `save_checkpoint_secs`", RUN, "save_checkpoint")(
    lambda tmp: _train(tmp, _build(), save_checkpoint_steps=1, save_checkpoint_secs=60))
case("`log_every_n_steps=0`", RUN, "log_every_n_steps")(
    lambda tmp: _train(tmp, _build(), log_every_n_steps=0))
case("`is_chief=False` without a `master`", RUN, "is_chief")(
    lambda tmp: _train(tmp, _build(), is_chief=False))
case("`scaffold='scaffold'` (not a Scaffold)", RUN, "scaffold")(
    lambda tmp: _train(tmp, _build(), scaffold="scaffold"))
case("`session_creator_wrapper=5` (not a function)", RUN, "session_creator_wrapper")(
    lambda tmp: _train(tmp, _build(), session_creator_wrapper=5))
case("`session_creator_wrapper=lambda creator: None`", RUN, "session_creator_wrapper",
     "returned None")(
    lambda tmp: _train(tmp, _build(), session_creator_wrapper=lambda creator: None))
case("`trace_steps=[0]`", RUN, "trace_steps")(
    lambda tmp: _train(tmp, _build(), trace_steps=[0]))
case("towers on `/device:CPU:5` with a 2-CPU session config", RUN, "/device:CPU:5")(
    lambda tmp: _train(tmp, _build(devices=["/device:CPU:0", "/device:CPU:5"])))
case("`max_steps=0`", RUN, "Nothing to train", "max_steps=0",
     info="Nothing to train")(lambda tmp: _train(tmp, _build(), max_steps=0))


@case("`max_steps` below the checkpoint's step (2 < 3)", RUN, "Nothing to train",
      "max_steps=2", info="Nothing to train")
def _max_steps_below_checkpoint(tmp):
    _train(tmp, _build(), max_steps=3)
    with tf.Graph().as_default():
        _train(tmp, _build(), max_steps=2)


@case("a `train_dir` whose every checkpoint is torn (`.index` cut short)", RUN,
      "No checkpoint", "can be restored")
def _torn_checkpoints(tmp):
    train_dir = os.path.join(tmp, "train")
    _train(tmp, _build(), max_steps=2, save_checkpoint_steps=1)
    for name in os.listdir(train_dir):
        if name.endswith(".index"):
            with open(os.path.join(train_dir, name), "r+b") as handle:
                handle.truncate(10)
    with tf.Graph().as_default():
        _train(tmp, _build(), max_steps=4)


def _nan_in_tower_1_at_step_2(tmp, optimizer):
    step = tf.compat.v1.train.get_or_create_global_step()

    def tower(inputs, ctx):
        loss = _tower(inputs, ctx)
        if ctx.index == 1:
            loss *= tf.where(tf.equal(step, 1), np.float32(np.nan), np.float32(1.0))
        return loss
    _train(tmp, _build(tower, optimizer=optimizer, global_step=step), max_steps=3,
           save_checkpoint_steps=1)


case("a NaN loss in tower 1 at step 2 (optimizer guarded)", RUN, "Non-finite", "step 2")(
    lambda tmp: _nan_in_tower_1_at_step_2(tmp, towerlib.guard_numerics(_sgd())))
case("a NaN loss in tower 1 at step 2 (optimizer not guarded)", RUN, "Non-finite",
     "step 2")(lambda tmp: _nan_in_tower_1_at_step_2(tmp, _sgd()))


@case("NaN in the data, optimizer guarded", OWN_SESSION, "NaN", "not applied",
      defect=GRAPH_EXECUTION)
def _nan_data_guarded(tmp):
    features, labels = _batch()
    features = tf.tensor_scatter_nd_update(features, [[5, 0]], [np.nan])
    train = _build(inputs=(features, labels), optimizer=towerlib.guard_numerics(_sgd()))
    with _session(train) as session:
        session.run(train.train_op)


@case("Replicated copies without `local_variables_initializer` (not `train.initialize`)",
      OWN_SESSION, "replicated/tower_1/w",
      defect=GRAPH_EXECUTION + "; TensorFlow's own FailedPreconditionError names the copy, "
             "not the fix (train.initialize(session))")
def _forgotten_local_initializer(tmp):
    def tower(inputs, ctx):  # one variable: the error names it whatever the run order
        return tf.reduce_mean(inputs[0] * tf.compat.v1.get_variable("w", [4]))
    train = _build(tower, update="replicated")
    with tf.compat.v1.Session(config=_session_config(2)) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train.train_op)


@case("the guard reused for a second train op", "`guard_numerics(...).minimize`",
      "wrap the optimizer again")
def _guard_reused(tmp):
    guard = towerlib.guard_numerics(_sgd())
    weights = tf.compat.v1.get_variable("w", initializer=1.0)
    guard.minimize(weights * weights)
    guard.minimize(2.0 * weights)


# --- validate_config ------------------------------------------------------------

@case("eight bad options at once", VALIDATE, "8 problems")
def _eight_problems(tmp):
    a_file = os.path.join(tmp, "a_file")
    with open(a_file, "w") as handle:
        handle.write("not a folder")
    towerlib.validate_config(
        num_towers=0, bn_mode="sync_all", update="mirrored", ema_decay=1.5,
        train_dir=os.path.join(a_file, "train"), max_steps=-1, save_checkpoint_steps=10,
        save_checkpoint_secs=60, is_chief=False, master="")


case("`per_tower_batch_size=8` x 4 towers but `global_batch_size=30`", VALIDATE,
     "per_tower_batch_size")(
    lambda tmp: towerlib.validate_config(num_towers=4, global_batch_size=30,
                                         per_tower_batch_size=8))
case("`/device:GPU:0`, `'gpu zero'`, a duplicate, a TPU as `devices`", VALIDATE,
     "4 problems")(
    lambda tmp: towerlib.validate_config(
        devices=["/device:GPU:0", "gpu zero", "/device:CPU:1", "/device:CPU:1",
                 "/device:TPU:0"]))
case("4 towers with `session_config(2)`", VALIDATE, "session_config")(
    lambda tmp: towerlib.validate_config(num_towers=4, session_config=_session_config(2)))
case("`global_batch_size=6`, `accumulation_steps=4`, 2 towers", VALIDATE,
     "accumulation_steps")(
    lambda tmp: towerlib.validate_config(num_towers=2, global_batch_size=6,
                                         accumulation_steps=4))


# --- data checks ------------------------------------------------------------------

@case("NaN in a batch under `assert_finite`", "`assert_finite` (own Session)",
      "images holds NaN or Inf", defect=GRAPH_EXECUTION)
def _assert_finite(tmp):
    images = tf.compat.v1.placeholder(tf.float32, [None, 2])
    checked = towerlib.assert_finite(images, "images")
    with tf.compat.v1.Session() as session:
        session.run(checked, {images: [[0.0, np.inf]]})


@case("label 12 with 10 classes", "`assert_labels_in_range` (own Session)",
      "labels must be in [0, 10)", defect=GRAPH_EXECUTION)
def _labels_out_of_range(tmp):
    labels = tf.compat.v1.placeholder(tf.int32, [None])
    checked = towerlib.assert_labels_in_range(labels, 10)
    with tf.compat.v1.Session() as session:
        session.run(checked, {labels: [1, 12, 3]})


@case("a truncated record file", "`check_record_files`", "data.bin")
def _truncated_records(tmp):
    path = os.path.join(tmp, "data.bin")
    with open(path, "wb") as handle:
        handle.write(b"\0" * 25)
    towerlib.check_record_files(path, record_bytes=10)


@case("an empty record file", "`check_record_files`", "empty.bin")
def _empty_records(tmp):
    path = os.path.join(tmp, "empty.bin")
    open(path, "wb").close()
    towerlib.check_record_files(path, record_bytes=10)


case("`FixedLengthRecords` with `record_bytes='5'` (a string)", "`FixedLengthRecords`",
     "record_bytes", "'5'")(
    lambda tmp: towerlib.FixedLengthRecords(tmp, "5", tf.identity))
case("`FixedLengthRecords` with `record_bytes=5.0` (not a whole number type)",
     "`FixedLengthRecords`", "record_bytes", "5.0")(
    lambda tmp: towerlib.FixedLengthRecords(tmp, 5.0, tf.identity))
case("`FixedLengthRecords([], 5, decode)`: no file", "`FixedLengthRecords.num_examples`",
     "No file given")(
    lambda tmp: towerlib.FixedLengthRecords([], 5, tf.identity).num_examples)


case("a stateful random op in a saved-position pipeline", "`saved_position_iterator`",
     "RandomUniform")(
    lambda tmp: towerlib.saved_position_iterator(tf.data.Dataset.range(10).map(
        lambda x: tf.cast(x, tf.float32) + tf.random.uniform([]))))


# --- layers -----------------------------------------------------------------------

case("uint8 images into `layers.conv2d`", "`layers.conv2d`", "conv1", "uint8")(
    lambda tmp: layers.conv2d(tf.zeros([2, 4, 4, 3], tf.uint8), 4, 3, name="conv1"))
case("float ids into `layers.embedding`", "`layers.embedding`", "integer ids")(
    lambda tmp: layers.embedding(tf.constant([[1.0, 2.0]]), 10, 4, name="embed"))
case("`kernel_size=(3, 3, 3)`", "`layers.conv2d`", "kernel_size")(
    lambda tmp: layers.conv2d(tf.zeros([2, 5, 5, 1]), 4, (3, 3, 3), name="conv"))
case("`axis=4` for a rank-4 input", "`towerlib.batch_norm`", "axis 4")(
    lambda tmp: towerlib.batch_norm(tf.zeros([2, 3, 3, 8]), towerlib.TowerContext.single(),
                                    name="bn", axis=4))
case("`renorm=True` in the TF 1 batch-norm drop-in", "`layers.for_tower(ctx)"
     ".batch_normalization`", "renorm")(
    lambda tmp: layers.for_tower(towerlib.TowerContext.single()).batch_normalization(
        tf.zeros([2, 3]), training=True, name="bn", renorm=True))


# --- evaluation -------------------------------------------------------------------

case("a metric that is a mean, not one value per example", "`build_eval_graph`",
     "one value per example")(
    lambda tmp: towerlib.build_eval_graph(
        lambda inputs, ctx: {"mean": tf.reduce_mean(inputs[0])}, _batch(6), devices=_cpus(2)))
case("a metric function returning one value per example, not a dict", "`build_eval_graph`",
     "metric_fn", "tf.Tensor")(
    lambda tmp: towerlib.build_eval_graph(
        lambda inputs, ctx: tf.cast(inputs[1], tf.float32), _batch(6), devices=_cpus(2)))
case("a metric function returning a scalar tensor, not a dict", "`build_eval_graph`",
     "metric_fn", "tf.Tensor")(
    lambda tmp: towerlib.build_eval_graph(
        lambda inputs, ctx: tf.reduce_mean(inputs[0]), _batch(6), devices=_cpus(2)))
case("a metric with twice the examples", "`build_eval_graph`", "'doubled'")(
    lambda tmp: towerlib.build_eval_graph(
        lambda inputs, ctx: {"doubled": tf.concat([inputs[1], inputs[1]], 0)},
        _batch(6), devices=_cpus(2)))



def _evaluation(**options):
    """An Evaluation of _tower's logits next to the training graph (built first)."""
    batches = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(_batch(6)).batch(3))

    def correct(inputs, ctx):
        logits = layers.dense(inputs[0], 3, name="logits")
        return {"correct": tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32),
                                            inputs[1]), tf.int32)}

    arguments = dict(every_n_steps=2, metric="correct", initializer=batches.initializer)
    arguments.update(options)
    return towerlib.Evaluation(towerlib.build_eval_graph(
        correct, batches.get_next(), devices=_cpus(2), reuse_variables=True), **arguments)


case("`higher_is_better='False'` (a string)", "`Evaluation`", "higher_is_better='False'",
     "True")(lambda tmp: (_build(), _evaluation(higher_is_better="False")))


@case("`every_n_steps=500` with `max_steps=100`: no evaluation would run", RUN,
      "every_n_steps=500", "max_steps=100")
def _evaluation_never_reached(tmp):
    train = _build()
    _train(tmp, train, max_steps=100, evaluation=_evaluation(every_n_steps=500))


# --- several machines -------------------------------------------------------------

_PS, _WORKERS = "127.0.0.1:2222", "127.0.0.1:2223,127.0.0.1:2224"

case("`--job_name=chief`", "`cluster.cluster_from_flags`", "'ps' or 'worker'")(
    lambda tmp: cluster_lib.cluster_from_flags(_PS, _WORKERS, "chief", 0))
case("`--task_index=2` with 2 workers", "`cluster.cluster_from_flags`", "task index 2")(
    lambda tmp: cluster_lib.cluster_from_flags(_PS, _WORKERS, "worker", 2))
case("`--ps_hosts=localhost` (no port)", "`cluster.cluster_from_flags`", "localhost",
     "host:port")(lambda tmp: cluster_lib.cluster_from_flags("localhost", _WORKERS,
                                                             "worker", 0))
case("`TF_CONFIG` that is not JSON", "`cluster.resolve_cluster`", "TF_CONFIG")(
    lambda tmp: cluster_lib.resolve_cluster(environ={"TF_CONFIG": "{not json"}))
case("`TF_CONFIG` with a task and no cluster", "`cluster.resolve_cluster`", "TF_CONFIG",
     "cluster")(lambda tmp: cluster_lib.resolve_cluster(
         environ={"TF_CONFIG": '{"task": {"type": "worker", "index": 1}}'}))
case("`bn_mode='sync'` across 2 workers", "`cluster.build_sync_train_graph`",
     "bn_mode='sync'", "workers")(
    lambda tmp: cluster_lib.build_sync_train_graph(
        _tower, _batch(), _sgd(), cluster_lib.cluster_from_flags(_PS, _WORKERS, "worker", 0),
        num_towers=2, device_type="cpu", bn_mode="sync"))
case("`precision='float16'` across workers", "`cluster.build_sync_train_graph`",
     "Float16()")(
    lambda tmp: cluster_lib.build_sync_train_graph(
        _tower, _batch(), _sgd(), cluster_lib.cluster_from_flags(_PS, _WORKERS, "worker", 0),
        num_towers=2, device_type="cpu", precision="float16"))


@case("a ps task that stays away (closed port, 1 s bound)",
      "a worker's session (`recovery.wait_for_ps_to_answer`)", "ps task 0", "1 s")
def _ps_lost(tmp):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    replica = cluster_lib.cluster_from_flags(f"127.0.0.1:{port}", "127.0.0.1:1,127.0.0.1:2",
                                             "worker", 1)
    cluster_lib.recovery.wait_for_ps_to_answer(replica, timeout_secs=1.0, poll_secs=0.2)


# ------------------------------------------------ the example scripts' errors

# Read from the tests that run a script and expect exit status 2 with one line
# on stderr (tests/examples/test_cifar10_*.py): the script, the arguments the
# test passes, the text it expects in the "error: " line. Not run here.
SCRIPT_TESTS = os.path.join(REPO_ROOT, "tests", "examples")
_CASE_LABELS = {"file": "`--train_dir` a file", "unwritable": "`--train_dir` unwritable"}


def _literal(node, constants):
    """The value of a literal test parameter; module constants and `+` allowed."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(element, constants) for element in node.elts]
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left, constants) + _literal(node.right, constants)
    raise ValueError(ast.dump(node))


def _constants(tree):
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = _literal(node.value, constants)
            except ValueError:
                pass
    return constants


def _parametrize_decorators(function):
    return [decorator for decorator in function.decorator_list
            if isinstance(decorator, ast.Call)
            and getattr(decorator.func, "attr", "") == "parametrize"]


def _parameter_names(function):
    names = []
    for decorator in _parametrize_decorators(function):
        if isinstance(decorator.args[0], ast.Constant):
            names += [name.strip() for name in decorator.args[0].value.split(",")]
    return names


def _parameter_sets(function, constants):
    """[{argname: value}] of the function's parametrize decorators (one set if none)."""
    sets = [{}]
    for decorator in _parametrize_decorators(function):
        names = [n.strip() for n in _literal(decorator.args[0], constants).split(",")]
        rows = _literal(decorator.args[1], constants)
        rows = [row if len(names) > 1 else [row] for row in rows]
        sets = [dict(old, **dict(zip(names, row))) for old in sets for row in rows]
    return sets


def _asserted_texts(function, constants):
    """Strings the function's asserts look for ('"x" in ...', '.startswith("x")')."""
    texts = []
    for node in ast.walk(function):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In):
            candidates = [node.left]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "startswith":
            candidates = node.args[:1]
        else:
            continue
        for candidate in candidates:
            try:
                value = _literal(candidate, constants)
            except ValueError:
                continue
            if isinstance(value, str) and value.strip() not in ("error:", "Traceback"):
                texts.append(value)
    return texts


def _script_test_files():
    """The example's test files git tracks (all of them outside a git checkout): a test
    file still being written does not change the table."""
    names = sorted(name for name in os.listdir(SCRIPT_TESTS)
                   if name.startswith("test_cifar10_") and name.endswith(".py"))
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--", "."], cwd=SCRIPT_TESTS, capture_output=True,
            text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return names
    return [name for name in names if name in tracked]


def script_errors():
    """[(command, expected text, test)] of every one-line script error the tests expect.

    A test counts when it checks `returncode == 2` itself, or when it is parametrized
    with an `expected` line and calls a helper of its module that checks it.
    """
    rows = []
    for name in _script_test_files():
        with open(os.path.join(SCRIPT_TESTS, name), encoding="utf-8") as handle:
            source = handle.read()
        tree = ast.parse(source)
        constants = _constants(tree)
        helpers = {node.name: ast.get_source_segment(source, node) for node in tree.body
                   if isinstance(node, ast.FunctionDef)
                   and "returncode == 2" in ast.get_source_segment(source, node)}
        for function in tree.body:
            if not isinstance(function, ast.FunctionDef) or not function.name.startswith(
                    "test_"):
                continue
            body = ast.get_source_segment(source, function)
            called = [helper for helper in helpers if re.search(rf"\b{helper}\(", body)]
            if "returncode == 2" not in body and not (
                    called and "expected" in _parameter_names(function)):
                continue
            parameter_sets = _parameter_sets(function, constants)
            scripts = re.findall(r"examples[./][\w./]*\w", body)
            scripts += [value for key, value in constants.items()
                        if re.search(rf"\b{key}\b", body) and isinstance(value, str)
                        and value.startswith("examples.")]
            inline = [element.value for node in ast.walk(function)
                      if isinstance(node, ast.List) for element in node.elts
                      if isinstance(element, ast.Constant) and isinstance(element.value, str)
                      and element.value.startswith("--")]
            for params in parameter_sets:
                expected = params.get("expected")
                texts = [expected] if expected else _asserted_texts(function, constants)
                script = (f"examples.cifar10.{params['script']}" if "script" in params
                          else scripts[0])
                args = params.get("args", inline)
                args = [arg.replace("{missing}", "<missing folder>") for arg in args]
                args += [f"--{key}={value}" for key, value in params.items()
                         if key not in ("args", "expected", "case", "script")]
                command = f"`{script} {' '.join(args)}`".replace(" `", "`")
                if params.get("case") in _CASE_LABELS:
                    command += f", {_CASE_LABELS[params['case']]}"
                rows.append((command, texts[0], f"{name}::{function.name}"))
    return rows


# ------------------------------------------------------------------ the runner

@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a case got.

    kind: 'raises', 'warns', 'logs' or 'nothing'; what: the exception type or the
    channel; first_line: the first line of the message; then: when the first line
    is only a header (it ends with ':'), the line that carries the message. Both
    normalized ($TMP, $PORT).
    """

    kind: str
    what: str
    first_line: str
    then: str = ""

    def cell(self):
        text = _escape(self.first_line)
        if self.then:
            text += f"<br>then: {_escape(self.then)}"
        if self.kind == "raises":
            return f"`{self.what}`: {text}"
        if self.kind == "warns":
            return f"warning ({self.what}), builds: {text}"
        if self.kind == "logs":
            return f"no error; {self.what}: {text}"
        return "**nothing**: it passes silently"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def _type_name(error):
    name = type(error).__name__
    if isinstance(error, tf.errors.OpError):
        return f"tf.errors.{name}"
    if getattr(towerlib, name, None) is type(error):
        return f"towerlib.{name}"
    return name


def _normalize(text, tmp):
    for path in sorted({tmp, os.path.realpath(tmp)}, key=len, reverse=True):
        text = text.replace(path, "$TMP")
    text = re.sub(r"127\.0\.0\.1:\d{5}\b", "127.0.0.1:$PORT", text)  # a free port
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def _lines(text):
    return [line.strip() for line in str(text).splitlines() if line.strip()]


def _first_line(text):
    lines = _lines(text)
    return lines[0] if lines else ""


_STACK_LINE = re.compile(r"^(Detected at node|File |Node: |\[\[|\d+ root error|Graph execution)")


def _message_line(text):
    """The line that carries the message when the first one is only a header: for
    TensorFlow's 'Graph execution error:', the first root error (not the node's stack);
    else the second line."""
    lines = _lines(text)
    if len(lines) < 2 or not lines[0].endswith(":"):
        return ""
    if lines[0] == "Graph execution error:":
        for line in lines[1:]:
            root = re.match(r"^\(0\) [A-Z_]+: (.*)", line)
            if root:
                return root.group(1)
        return next((line for line in lines[1:] if not _STACK_LINE.match(line)), "")
    return lines[1].lstrip("- ")


def _escape(text):
    return text.replace("|", "\\|")


def run_case(case_):
    """Runs one case in a fresh graph and temporary directory; its Outcome."""
    tmp = tempfile.mkdtemp(prefix="towerlib_bad_input_")
    logger = logging.getLogger("towerlib")
    records = _Records()
    saved = (logger.level, logger.propagate)
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught, tf.Graph().as_default():
            warnings.simplefilter("always")
            try:
                case_.run(tmp)
            except Exception as error:  # noqa: BLE001  (what the user gets, whatever it is)
                return Outcome("raises", _type_name(error),
                               _normalize(_first_line(error), tmp),
                               _normalize(_message_line(error), tmp))
        for record in records.records:
            if record.levelno >= logging.WARNING:
                return Outcome("warns", "towerlib log",
                               _normalize(_first_line(record.getMessage()), tmp))
        for warning in caught:
            if "towerlib" in str(warning.filename):
                return Outcome("warns", warning.category.__name__,
                               _normalize(_first_line(warning.message), tmp))
        if case_.info:
            for record in records.records:
                if record.getMessage().startswith(case_.info):
                    return Outcome("logs", "INFO log",
                                   _normalize(_first_line(record.getMessage()), tmp))
        return Outcome("nothing", "", "")
    finally:
        logger.removeHandler(records)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        shutil.rmtree(tmp, ignore_errors=True)


def library_table(outcomes):
    rows = ["| bad input | where | what you get (exception: first line) |",
            "| --- | --- | --- |"]
    for case_, outcome in zip(CASES, outcomes):
        rows.append(f"| {case_.bad_input} | {case_.where} | {outcome.cell()} |")
    return "\n".join(rows)


def script_table():
    rows = ["| bad command line | what you get | test |", "| --- | --- | --- |"]
    for command, text, test in script_errors():
        text = text.rstrip()
        line = text if text.startswith("error: ") else f"error: ... {text}"
        rows.append(f"| {_escape(command)} | exit status 2, one line: `{_escape(line)} ...` "
                    f"| `{test}` |")
    return "\n".join(rows)


SECTION = "## Every bad input we test, and the first line it gets"
LEDGER_MD = os.path.join(REPO_ROOT, "tests", "faults_ledger.md")

INTRO = """\
Each row is one wrong input, given to towerlib alone in a fresh graph by
`tests/checks/bad_inputs.py`, with the type of what comes back and the first line of
its message: the line a traceback ends with. Where that line is only a
header ending in ":" (a `ConfigError` counting its problems, a list of
layers, files or towers, TensorFlow's "Graph execution error:" in your own
`Session`), "then:" shows the line that says what is wrong. "warning,
builds" means the graph is built anyway; "no error" means towerlib answers
with an INFO line only. `$TMP` is the case's temporary directory.

Regenerate this section with `python tests/checks/bad_inputs.py --write` (`python
tests/checks/bad_inputs.py` prints it). `tests/checks/test_bad_inputs_table.py` fails
when this section differs from what the script prints, when an input passes
silently, or when a first line does not name the option or the problem
(the known exceptions are marked `defect=` in the script).
"""

NOT_IN_TABLE = """\
Not in the table, because nothing answers it: NaN in the data in your own
`Session` with an unguarded optimizer (the step runs and the weights become
NaN, [NaN/Inf guard](#naninf-guard)); the guarded optimizer and
`assert_finite` rows above are the ways to catch it there.
"""

SCRIPTS_INTRO = """\
### The example scripts

Each command below ends with exit status 2 and one line on stderr, without a
traceback: the test named (in `tests/examples/`) runs the script in a fresh
process and checks that the line starts with the text shown (or, after
`error: ...`, contains it). `tests/checks/bad_inputs.py` does not run them (several
seconds each); it reads them from the tests. The scripts' in-process checks
(`options.FlagError` in `test_cifar10_config.py`, `test_cifar10_precision.py`,
`test_cifar10_replicated.py`, `test_cifar10_distributed.py`,
`test_cifar10_eval_towers.py`) test the same messages for more flags.
"""


def section(outcomes):
    """The section of tests/faults_ledger.md: heading, text and both tables."""
    return "\n\n".join([SECTION, INTRO.strip(), library_table(outcomes), NOT_IN_TABLE.strip(),
                        SCRIPTS_INTRO.strip(), script_table()]) + "\n"


def section_in_ledger(text):
    """The section as tests/faults_ledger.md holds it (`text` is the file), or None."""
    if SECTION not in text:
        return None
    return SECTION + text.split(SECTION, 1)[1].split("\n## ", 1)[0].rstrip("\n") + "\n"


def write_section(new_section, path=LEDGER_MD):
    """Replaces the section in tests/faults_ledger.md (or puts it before '## Checkpoints')."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    old = section_in_ledger(text)
    if old is not None:
        text = text.replace(old, new_section, 1)
    else:
        text = text.replace("\n## Checkpoints\n", "\n" + new_section + "\n## Checkpoints\n", 1)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def main(argv):
    started = time.monotonic()
    outcomes = []
    for case_ in CASES:
        began = time.monotonic()
        outcomes.append(run_case(case_))
        if os.environ.get("BAD_INPUTS_TIMES"):
            sys.stderr.write(f"{time.monotonic() - began:5.1f} s  {case_.bad_input}\n")
    if "--write" in argv[1:]:
        write_section(section(outcomes))
    else:
        sys.stdout.write(section(outcomes))
    sys.stderr.write(f"{len(CASES)} cases in {time.monotonic() - started:.0f} s\n")


if __name__ == "__main__":
    main(sys.argv)
