"""Replicated(shard_update=True): each tower applies the optimizer to its shard only.

Held to unsharded Replicated(): the same arithmetic on the same summed gradient (the
owner's update is the update every copy makes unsharded), so every weight, slot and
moving statistic is bit-identical, not only close; and a checkpoint's names and
values are the unsharded run's, so either restores into the other.

Bit for bit with grappler's arithmetic optimizer off. On, it rewrites a sum of the
towers' gradients by the buffer the sum is in, so the rounding of a sum of three or
more towers can differ in the last bit: unsharded Replicated() itself changes so
between pack_bytes=0 and its default. The sharded update sums in buffers of its own
(each owner's weights), so with the session's defaults it is held within 1e-6.
"""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from tests.update.test_replicated import run
from towerlib.internals import saver_names
from towerlib.update import sharded, slot_shards

SHARDED = towerlib.Replicated(shard_update=True)
SLOW = pytest.mark.slow


def _assert_identical(left, right):
    assert sorted(left) == sorted(right)
    for name in left:
        np.testing.assert_array_equal(left[name], right[name], err_msg=name)


@pytest.fixture(autouse=True)
def without_arithmetic_rewrites(request, monkeypatch):
    """The sessions of a test run with grappler's arithmetic optimizer off (see the
    module docstring), unless the test is marked `with_rewrites`."""
    if request.node.get_closest_marker("with_rewrites"):
        return
    from tensorflow.core.protobuf import rewriter_config_pb2
    session_config = towerlib.session_config

    def config(*args, **kwargs):
        made = session_config(*args, **kwargs)
        made.graph_options.rewrite_options.arithmetic_optimization = (
            rewriter_config_pb2.RewriterConfig.OFF)
        return made
    monkeypatch.setattr(towerlib, "session_config", config)


@pytest.mark.with_rewrites
@pytest.mark.parametrize("num_towers", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_with_the_sessions_defaults_every_value_is_within_1e_6(num_towers):
    batch = helpers.image_batch(10, seed=3)
    unsharded, _, _ = run(helpers.conv_bn_model, batch, "adam", num_towers, "replicated",
                          bn_mode="sync")
    got, _, _ = run(helpers.conv_bn_model, batch, "adam", num_towers, SHARDED,
                    bn_mode="sync")
    assert sorted(got) == sorted(unsharded)
    for name in got:
        np.testing.assert_allclose(got[name], unsharded[name], rtol=0, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("optimizer_kind, num_towers, bn_mode", [
    ("momentum", 2, "first_tower"), ("adam", 3, "sync"),
    pytest.param("adam", 4, "all_towers", marks=SLOW),
    pytest.param("momentum", 4, "sync", marks=SLOW)])
def test_every_weight_slot_and_statistic_is_the_unsharded_run_bit_for_bit(
        optimizer_kind, num_towers, bn_mode):
    batch = helpers.image_batch(10, seed=3)  # uneven over 3 and 4 towers
    unsharded, _, unsharded_copies = run(helpers.conv_bn_model, batch, optimizer_kind,
                                         num_towers, "replicated", bn_mode=bn_mode)
    got, _, copies = run(helpers.conv_bn_model, batch, optimizer_kind, num_towers, SHARDED,
                         bn_mode=bn_mode)
    _assert_identical(got, unsharded)
    for name, values in copies.items():  # every tower's copy of a weight: the owner's
        for tower, value in enumerate(values):
            np.testing.assert_array_equal(value, unsharded_copies[name][0],
                                          err_msg=f"{name} tower {tower}")


def test_clipping_accumulation_and_averages_are_the_unsharded_run_bit_for_bit(monkeypatch):
    # The averages start from the weights' initializers (run() loads fixed values into
    # the weights only): one graph seed gives both builds the same initial weights.
    build = towerlib.build_train_graph

    def seeded_build(*args, **kwargs):
        tf.compat.v1.set_random_seed(7)
        return build(*args, **kwargs)

    monkeypatch.setattr(towerlib, "build_train_graph", seeded_build)
    batch = helpers.image_batch(12, seed=5)
    options = dict(clipping=towerlib.ClipByGlobalNorm(0.05), accumulation_steps=2,
                   ema_decay=0.9)
    unsharded, _, _ = run(helpers.conv_bn_model, batch, "adam", 3, "replicated", **options)
    got, _, _ = run(helpers.conv_bn_model, batch, "adam", 3, SHARDED, **options)
    _assert_identical(got, unsharded)


def _slot_devices(num_towers, optimizer_kind="adam"):
    """{slot name: the device it lives on} of a sharded build, and its owners."""
    with tf.Graph().as_default():
        images, labels = helpers.image_batch(8)
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.AdamOptimizer(0.01), devices=helpers.cpu_devices(num_towers),
            update=SHARDED)
        del train
        every = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        names = {v.op.name for v in every}
        slots = {v.op.name: v.device for v in every
                 if v.op.name.rsplit("/", 1)[0] in names}
        return slots


def test_a_slot_exists_once_on_its_owner_under_its_plain_name():
    slots = _slot_devices(3)
    assert slots and not [name for name in slots if name.startswith("replicated/")], slots
    devices = {device.rsplit(":", 1)[-1] for device in slots.values()}
    assert devices == {"0", "1", "2"}, slots  # the three towers each hold some


def test_the_balance_rule_puts_the_largest_first_onto_the_lightest_tower():
    sizes = {"a": 6, "b": 4, "c": 3, "d": 2, "e": 1}
    assert sharded.owners_by_bytes(sizes, 2) == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}
    for towers in (2, 3, 4, 8):
        owners = sharded.owners_by_bytes({f"v{i}": 10 + i for i in range(20)}, towers)
        held = [sum(10 + int(n[1:]) for n, t in owners.items() if t == tower)
                for tower in range(towers)]
        assert max(held) <= sum(held) / towers + 29  # 1/N, give or take one variable


@pytest.mark.parametrize("first, second", [(SHARDED, "replicated"), ("replicated", SHARDED)])
def test_a_checkpoint_restores_across_sharding_and_tower_counts(tmp_path, first, second):
    batch = helpers.image_batch(12, seed=7)
    prefix = str(tmp_path / "model.ckpt")
    with tf.Graph().as_default():
        inputs = tuple(tf.constant(x) for x in batch)
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, inputs, tf.compat.v1.train.AdamOptimizer(0.01),
            devices=helpers.cpu_devices(2), update=first)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(2):
                session.run(train.train_op)
            saver.save(session, prefix)
            saved = {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()}
    with tf.Graph().as_default():
        inputs = tuple(tf.constant(x) for x in batch)
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, inputs, tf.compat.v1.train.AdamOptimizer(0.01),
            devices=helpers.cpu_devices(3), update=second)
        with tf.compat.v1.Session(config=towerlib.session_config(3)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().restore(session, prefix)
            session.run(train.sync_copies_op)
            restored = {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()}
            for copies in train.variable_copies.values():
                values = session.run(copies)
                for value in values[1:]:
                    np.testing.assert_array_equal(value, values[0])
    _assert_identical(restored, saved)


def test_shard_update_is_a_bool():
    with pytest.raises(TypeError, match="shard_update=True or False"):
        towerlib.Replicated(shard_update="yes")


@pytest.mark.parametrize("num_towers", [2, 4, pytest.param(8, marks=SLOW)])
def test_each_tower_holds_a_1_over_n_share_of_the_slots(num_towers):
    """Read from the built graph: sharded, a tower's slot bytes are 1/N of the unsharded
    tower's, give or take the largest variable's slots (Adam: 2 per weight)."""
    def slot_bytes(update):
        with tf.Graph().as_default():
            images, labels = helpers.image_batch(16)
            train = towerlib.build_train_graph(
                helpers.conv_dense_model, (tf.constant(images), tf.constant(labels)),
                tf.compat.v1.train.AdamOptimizer(0.01),
                devices=helpers.cpu_devices(num_towers), update=update)
            held = towerlib.replica_bytes(train)
            largest = max(v.shape.num_elements() * 4 for v in tf.compat.v1.trainable_variables())
            return held, largest
    unsharded, largest = slot_bytes("replicated")
    got, _ = slot_bytes(SHARDED)
    # An unsharded tower holds every slot; tower 0 also Adam's two step powers (8 bytes).
    whole = max(held["slots"] for held in unsharded.values())
    assert all(whole - held["slots"] in (0, 8) for held in unsharded.values()), unsharded
    for device, held in got.items():
        assert abs(held["slots"] - whole / num_towers) <= 2 * largest + 8, (device, got)
        assert held["weights"] == unsharded[device]["weights"]
        assert held["gradients"] == unsharded[device]["gradients"] > 0
    assert sum(h["slots"] for h in got.values()) == whole


def test_across_workers_each_slot_is_held_by_one_owner_among_every_workers_towers():
    """Built as worker 1 of 2 with 2 towers (the graph only): the owners are members
    0..3 of the whole group; this worker holds, by their plain names, only the slots
    of members 2 and 3 (its towers), and a saveable for every slot of every weight."""
    with tf.Graph().as_default() as graph:
        images, labels = helpers.image_batch(8)
        towerlib.build_train_graph(
            helpers.conv_dense_model, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.AdamOptimizer(0.01), devices=helpers.cpu_devices(2),
            update=SHARDED, workers=towerlib.WorkerGroup(2, 1))
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        shards = slot_shards.shards_of(graph)
        saved = [s.name for s in slot_shards.saveables_of(graph)]
    weights = sorted({name.rsplit("/", 1)[0] for name in (s.name for s in shards)})
    assert len(weights) >= 4, weights
    assert sorted(s.name for s in shards) == sorted(
        f"{w}/{slot}" for w in weights for slot in ("Adam", "Adam_1"))
    assert sorted(saved) == sorted(s.name for s in shards)   # every slot is saved whole
    assert {s.owner for s in shards} == {0, 1, 2, 3}
    for shard in shards:
        here = shard.owner in (2, 3)
        assert (shard.name in variables) == here, shard
        assert (shard.variable is not None) == here, shard
        if here:   # on its owner tower's device: tower owner - 2 of this worker
            assert variables[shard.name].device.endswith(f"CPU:{shard.owner - 2}"), shard


def test_across_workers_gpu_towers_save_the_gathered_slots_from_host_memory():
    """Built for 2 GPU towers (the graph only; no GPU is needed to build it): each
    slot is gathered on the towers, and what the Saver saves is on the worker's CPU,
    so a GPU never holds every slot at once (the state sharding spares it)."""
    with tf.Graph().as_default() as graph:
        images, labels = helpers.image_batch(8)
        towerlib.build_train_graph(
            helpers.conv_dense_model, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.AdamOptimizer(0.01),
            devices=["/device:GPU:0", "/device:GPU:1"], update=SHARDED,
            workers=towerlib.WorkerGroup(2, 0))
        saved = slot_shards.saveables_of(graph)
        owned = [s.variable for s in slot_shards.shards_of(graph) if s.variable is not None]
    assert saved and owned
    assert {spec.tensor.device for s in saved for spec in s.specs} == {"/device:CPU:0"}
    assert {v.device for v in owned} <= {"/device:GPU:0", "/device:GPU:1"}


def _sharded_over_workers(tower_fn, workers=2, towers=2):
    """A graph built as worker 0 of `workers`, Adam, sharded; (graph, TrainGraph)."""
    graph = tf.Graph()
    with graph.as_default():
        images, labels = helpers.image_batch(8)
        train = towerlib.build_train_graph(
            tower_fn, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.AdamOptimizer(0.01), devices=helpers.cpu_devices(towers),
            update=SHARDED, workers=towerlib.WorkerGroup(workers, 0))
    return graph, train


def test_across_workers_a_worker_that_would_own_no_variable_is_refused():
    def one_weight(inputs, ctx):
        del ctx
        images, labels = inputs
        logits = tf.reshape(images, [-1, 72])[:, :3] * tf.compat.v1.get_variable(
            "scale", [], initializer=tf.compat.v1.ones_initializer())
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
    with pytest.raises(ValueError, match="some worker would own none"):
        _sharded_over_workers(one_weight)


def test_across_workers_each_slot_has_its_own_weights_dtype():
    """A float64 weight beside float32 ones: every worker describes each slot, the
    ones other workers hold too, with its own weight's dtype (the gathers at a save
    and the refill are built per dtype from these)."""
    def two_dtypes(inputs, ctx):
        loss = helpers.conv_dense_model(inputs, ctx)
        offset = tf.compat.v1.get_variable("offset", [3], tf.float64,
                                           initializer=tf.compat.v1.ones_initializer())
        return loss + tf.cast(tf.reduce_sum(tf.square(offset)), tf.float32)
    dtypes = {}
    for worker in (0, 1):
        graph = tf.Graph()
        with graph.as_default():
            images, labels = helpers.image_batch(8)
            towerlib.build_train_graph(
                two_dtypes, (tf.constant(images), tf.constant(labels)),
                tf.compat.v1.train.AdamOptimizer(0.01), devices=helpers.cpu_devices(2),
                update=SHARDED, workers=towerlib.WorkerGroup(2, worker))
            weights = {v.op.name: v.dtype.base_dtype
                       for v in tf.compat.v1.trainable_variables()}
        dtypes[worker] = {s.name: s.dtype for s in slot_shards.shards_of(graph)}
        for name, dtype in dtypes[worker].items():
            assert dtype == weights[name.rsplit("/", 1)[0]], (worker, name)
    assert dtypes[0] == dtypes[1]
    assert dtypes[0]["offset/Adam"] == tf.float64


def test_across_workers_run_training_itself_is_refused_before_it_saves_a_part(tmp_path):
    """Without run_distributed_training's Saver (every slot whole), a checkpoint of
    run_training would hold this worker's slots only: refused before it connects."""
    graph, train = _sharded_over_workers(helpers.conv_dense_model)
    with graph.as_default():
        with pytest.raises(towerlib.ConfigError, match="run_distributed_training"):
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=1,
                                  master="grpc://127.0.0.1:1")
    slot_shards.install_whole_saver(graph)
    assert slot_shards.saves_whole(graph)


def test_across_workers_a_saver_of_ones_own_is_refused_before_it_saves_a_part():
    graph, _ = _sharded_over_workers(helpers.conv_dense_model)
    with graph.as_default():   # where a Scaffold finds the Saver to save with
        graph.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, tf.compat.v1.train.Saver())
    with pytest.raises(ValueError, match="would save only the optimizer slots this worker"):
        slot_shards.install_whole_saver(graph)


def test_across_workers_the_run_saver_saves_every_slot_by_its_plain_name():
    graph, _ = _sharded_over_workers(helpers.conv_dense_model)
    slot_shards.install_whole_saver(graph)
    saver, = graph.get_collection(tf.compat.v1.GraphKeys.SAVERS)
    names = sorted(saver_names.saver_names(saver._var_list))
    assert sorted(slot_shards.sharded_names(graph)) == [n for n in names if "/Adam" in n]
    assert "beta1_power" in names and "global_step" in names


def test_across_workers_a_checkpoint_without_the_slots_is_refused_for_the_refill(tmp_path):
    graph, _ = _sharded_over_workers(helpers.conv_dense_model)
    with tf.Graph().as_default():   # the weights only: saved by a run with plain SGD
        weights = [tf.compat.v1.get_variable(n, [1]) for n in ("conv1/weights", "fc1/weights")]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = tf.compat.v1.train.Saver(weights).save(session, str(tmp_path / "sgd"))
    with pytest.raises(ValueError, match=r"has no .*/Adam.*optimizer slots missing"):
        slot_shards.check_holds_every_slot(graph, prefix)


TRUST_RATIO = {
    "lars": lambda: towerlib.optimizers.LARSOptimizer(0.1, momentum=0.9, weight_decay=1e-4),
    "lamb": lambda: towerlib.optimizers.LAMBOptimizer(0.01, weight_decay=1e-4),
}


@pytest.mark.parametrize("kind", ["lars", pytest.param("lamb", marks=SLOW)])
def test_lars_and_lamb_see_whole_layers_and_match_bit_for_bit(monkeypatch, kind):
    """Shards are whole variables, so a layer's trust ratio is the whole layer's."""
    from tests.update import test_replicated
    monkeypatch.setattr(test_replicated, "_optimizer", lambda _: TRUST_RATIO[kind]())
    batch = helpers.image_batch(10, seed=9)
    unsharded, _, _ = run(helpers.conv_bn_model, batch, kind, 3, "replicated")
    got, _, _ = run(helpers.conv_bn_model, batch, kind, 3, SHARDED)
    _assert_identical(got, unsharded)


@pytest.mark.parametrize("precision", [
    "bfloat16", pytest.param(towerlib.Float16(), marks=SLOW)])
def test_half_precision_matches_bit_for_bit(monkeypatch, precision):
    """The same half-precision towers and the same float32 update: no tolerance needed
    (float16's loss scale, and its skip of an overflowing step, included)."""
    from tests.update import test_replicated
    weights = test_replicated._model_variables
    monkeypatch.setattr(test_replicated, "_model_variables",  # not the loss scale's scalars
                        lambda: [v for v in weights() if v.shape.rank])
    batch = helpers.image_batch(10, seed=11)
    unsharded, _, _ = run(helpers.conv_bn_model, batch, "adam", 2, "replicated",
                          precision=precision)
    got, _, _ = run(helpers.conv_bn_model, batch, "adam", 2, SHARDED, precision=precision)
    _assert_identical(got, unsharded)


@pytest.mark.parametrize("exchange", ["graph", "collective"])
def test_a_step_moves_what_one_ring_all_reduce_of_the_weights_moves(exchange):
    """Counted from the built graph (bench/traffic_count.py), nothing run: 8 equal weights
    on 4 towers, each tower owns 2. A tower sends its gradients of the 6 it does not own
    to their owners and its 2 updated weights to the 3 other towers: 3/4 S + 3/4 S, the
    2 (N - 1) / N x S a ring all-reduce moves, and receives as much."""
    from bench import traffic_count

    def model(inputs, ctx):
        del ctx
        hidden = inputs[0]
        for index in range(8):
            hidden = tf.nn.relu(towerlib.layers.dense(hidden, 64, name=f"d{index}",
                                                      use_bias=False))
        return tf.reduce_mean(tf.square(hidden))

    with tf.Graph().as_default():
        batch = (tf.constant(np.ones([8, 64], np.float32)), tf.constant(np.zeros([8])))
        train = towerlib.build_train_graph(
            model, batch, tf.compat.v1.train.AdamOptimizer(0.1),
            devices=helpers.cpu_devices(4), update=SHARDED, exchange=exchange,
            summaries=False)
        weights = 8 * 64 * 64 * 4
        per_device = traffic_count.count_traffic(train.train_op).per_device(
            kinds=["variable", "computed", "collective"])
    ring = traffic_count.ring_all_reduce_bytes(weights, 4)
    assert len(per_device) == 4
    for device, (sent, received) in per_device.items():
        # Beside the weights: the towers' losses and a few scalars (under 0.5%).
        assert ring <= sent <= 1.005 * ring and ring <= received <= 1.005 * ring, (
            device, sent / ring, received / ring)


@pytest.mark.parametrize("exchange", ["graph", "collective"])
def test_sparse_gradients_reach_their_owner_under_either_exchange(exchange):
    """An embedding's IndexedSlices go to its owner, which concatenates every tower's
    rows in tower order, as Replicated() gathers them: no collective that only the
    owner would run (a collective gather is run by every member or none)."""
    batch = helpers.id_batch(10)
    unsharded, _, _ = run(helpers.embedding_model, batch, "momentum", 3, "replicated")
    got, train, _ = run(helpers.embedding_model, batch, "momentum", 3, SHARDED,
                        exchange=exchange)
    _assert_identical(got, unsharded)
    table = [g for g, v in train.grads_and_vars if "embed" in v.op.name]
    assert type(table[0]).__name__ == "IndexedSlices"
