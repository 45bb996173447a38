"""update='replicated': a copy of every variable per tower, gradients all-reduced.

The gold standard: the same weights, slots and moving statistics as the
parameter-server build (itself checked against one device in
test_equivalence.py and test_sync_batch_norm.py), the weights as one device
on the whole batch, and every tower's copies bit-identical to each other.
"""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers

TOLERANCE = 1e-5


def _optimizer(kind):
    if kind == "adam":
        return tf.compat.v1.train.AdamOptimizer(0.01)
    return helpers.make_optimizer(kind)


def _saved_values(session):
    """Every global variable but the step, by name: what a checkpoint holds."""
    return {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()
            if "global_step" not in v.op.name}


def _model_variables():
    """The model's own variables (no optimizer state), tower 0's copies."""
    return [v for v in helpers.model_variables()
            if "Adam" not in v.op.name and not v.op.name.endswith("_power")]


def _start_values():
    """The shared starting weights of every run (by name, from one seed)."""
    return helpers.initial_values_for(_model_variables())


def run(model_fn, batch, optimizer_kind, num_towers, variable_update, steps=5, **options):
    """Trains `steps` steps; returns (saved values by name, train graph, copies by name)."""
    graph = tf.Graph()
    with graph.as_default():
        inputs = tuple(tf.constant(x) for x in batch)
        train = towerlib.build_train_graph(
            model_fn, inputs, _optimizer(optimizer_kind),
            devices=helpers.cpu_devices(num_towers), update=variable_update,
            **options)
        start = _start_values()
        config = towerlib.session_config(num_towers, allow_soft_placement=False)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, _model_variables(), start)
            session.run(tf.compat.v1.local_variables_initializer())  # copies <- tower 0
            for _ in range(steps):
                session.run(train.train_op)
            assert session.run(train.global_step) == steps
            copies = {name: session.run(variables)
                      for name, variables in train.variable_copies.items()}
            return _saved_values(session), train, copies


def _assert_copies_identical(copies, num_towers):
    assert copies, "no replicated variables were recorded"
    for name, values in copies.items():
        assert len(values) == num_towers, name
        for tower, value in enumerate(values[1:], start=1):
            np.testing.assert_array_equal(value, values[0], err_msg=f"{name} tower {tower}")


def _assert_close(left, right):
    assert helpers.max_abs_difference(left, right) <= TOLERANCE


SLOW = pytest.mark.slow


@pytest.mark.parametrize("num_towers", [pytest.param(1, marks=SLOW), 2, 3,
                                        pytest.param(4, marks=SLOW)])
def test_weights_and_slots_equal_parameter_server_and_one_device(num_towers):
    batch = helpers.image_batch(10)  # not divisible by 3 or 4
    replicated, train, copies = run(
        helpers.conv_dense_model, batch, "momentum", num_towers, "replicated")
    server, _, _ = run(helpers.conv_dense_model, batch, "momentum", num_towers,
                       "parameter_server")
    _assert_close(replicated, server)
    reference = helpers.run_reference(helpers.conv_dense_model, batch, "momentum")
    _assert_close({k: replicated[k] for k in reference}, reference)
    _assert_copies_identical(copies, num_towers)
    assert any(name.endswith("/Momentum") for name in copies)
    # Only tower 0's copies are saved, under the plain names.
    assert not [name for name in replicated if name.startswith("replicated/")]
    assert [g for g, v in train.grads_and_vars if v.op.name == "conv1/weights"]


@pytest.mark.parametrize("optimizer_kind", [pytest.param("sgd", marks=SLOW), "adam"])
def test_other_optimizers(optimizer_kind):
    batch = helpers.image_batch(10, seed=2)
    replicated, _, copies = run(helpers.conv_dense_model, batch, optimizer_kind, 3,
                                "replicated")
    server, _, _ = run(helpers.conv_dense_model, batch, optimizer_kind, 3,
                       "parameter_server")
    _assert_close(replicated, server)
    _assert_copies_identical(copies, 3)


@pytest.mark.parametrize("bn_mode", ["first_tower", "all_towers", "sync"])
def test_every_batch_norm_mode_keeps_the_moving_statistics_of_one_copy(bn_mode):
    batch = helpers.image_batch(10, seed=4)
    replicated, _, copies = run(helpers.conv_bn_model, batch, "momentum", 3, "replicated",
                                bn_mode=bn_mode)
    server, _, _ = run(helpers.conv_bn_model, batch, "momentum", 3, "parameter_server",
                       bn_mode=bn_mode)
    _assert_close(replicated, server)
    _assert_copies_identical(copies, 3)
    assert "bn_conv1/moving_mean" in copies
    assert not np.allclose(replicated["bn_conv1/moving_mean"], 0.0)  # it was updated


def test_collective_transport_gives_the_same_result():
    batch = helpers.image_batch(9, seed=6)
    graph_hub, _, _ = run(helpers.conv_bn_model, batch, "momentum", 3, "replicated",
                          bn_mode="sync", exchange="graph")
    collective, _, copies = run(helpers.conv_bn_model, batch, "momentum", 3, "replicated",
                                bn_mode="sync", exchange="collective")
    _assert_close(collective, graph_hub)
    _assert_copies_identical(copies, 3)


@pytest.mark.parametrize("num_towers", [2, pytest.param(3, marks=SLOW)])
def test_sparse_gradients_stay_sparse_and_match(num_towers):
    batch = helpers.id_batch(10)
    replicated, train, copies = run(helpers.embedding_model, batch, "momentum", num_towers,
                                    "replicated")
    server, _, _ = run(helpers.embedding_model, batch, "momentum", num_towers,
                       "parameter_server")
    _assert_close(replicated, server)
    _assert_copies_identical(copies, num_towers)
    table_grads = [g for g, v in train.grads_and_vars if "embed" in v.op.name]
    assert type(table_grads[0]).__name__ == "IndexedSlices"


def test_packing_on_and_off_give_the_same_weights():
    batch = helpers.image_batch(8, seed=8)
    packed, _, _ = run(helpers.conv_dense_model, batch, "momentum", 2, "replicated")
    unpacked, _, _ = run(helpers.conv_dense_model, batch, "momentum", 2,
                         towerlib.Replicated(pack_bytes=0))
    for name in packed:
        np.testing.assert_array_equal(packed[name], unpacked[name], err_msg=name)


def test_packing_groups_follow_the_byte_limit():
    from towerlib.update.allreduce import pack_groups
    with tf.Graph().as_default():
        tensors = [tf.zeros([100]), tf.zeros([100]), tf.zeros([300]),
                   tf.zeros([10], tf.float16), tf.zeros([5])]
        assert pack_groups(tensors, 1024) == [[0, 1], [2], [3], [4]]
        assert pack_groups(tensors, 0) == [[0], [1], [2], [3], [4]]
        assert pack_groups(tensors, 1 << 20) == [[0, 1, 2], [3], [4]]


def test_replicated_checkpoint_restores_into_a_parameter_server_graph(tmp_path):
    batch = helpers.image_batch(8, seed=9)
    inputs = lambda: tuple(tf.constant(x) for x in batch)  # noqa: E731
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, inputs(), _optimizer("momentum"),
            devices=helpers.cpu_devices(2), update="replicated")
        towerlib.run_training(train, train_dir=str(tmp_path), max_steps=3,
                              session_config=towerlib.session_config(2),
                              save_summaries_steps=None)
    prefix = towerlib.find_restorable_checkpoint(str(tmp_path))
    with tf.Graph().as_default():
        server = towerlib.build_train_graph(
            helpers.conv_dense_model, inputs(), _optimizer("momentum"),
            devices=helpers.cpu_devices(2))
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            tf.compat.v1.train.Saver().restore(session, prefix)  # every name matches
            assert session.run(server.global_step) == 3
            restored = _saved_values(session)
    reader = tf.train.load_checkpoint(prefix)
    for name, value in restored.items():
        np.testing.assert_array_equal(value, reader.get_tensor(name), err_msg=name)


def test_parameter_server_checkpoint_resumes_in_replicated_mode(tmp_path):
    batch = helpers.image_batch(8, seed=10)
    inputs = lambda: tuple(tf.constant(x) for x in batch)  # noqa: E731

    def train_to(step, variable_update):
        with tf.Graph().as_default():
            train = towerlib.build_train_graph(
                helpers.conv_bn_model, inputs(), _optimizer("momentum"),
                devices=helpers.cpu_devices(3), update=variable_update,
                bn_mode="all_towers")
            towerlib.run_training(train, train_dir=str(tmp_path / variable_update),
                                  max_steps=step, session_config=towerlib.session_config(3),
                                  save_summaries_steps=None)
            return towerlib.find_restorable_checkpoint(str(tmp_path / variable_update))

    def values(prefix):
        reader = tf.train.load_checkpoint(prefix)
        return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}

    server_2 = train_to(2, "parameter_server")
    (tmp_path / "replicated").mkdir()
    for path in tf.io.gfile.glob(server_2 + "*"):
        tf.io.gfile.copy(path, str(tmp_path / "replicated" / path.split("/")[-1]))
    resumed_4 = values(train_to(4, "replicated"))   # restores step 2, copies, trains 2 more
    server_4 = values(train_to(4, "parameter_server"))
    assert resumed_4["global_step"] == server_4["global_step"] == 4
    _assert_close(resumed_4, server_4)


def test_replicated_checks_itself_when_constructed():
    """A parameter device is not an option of Replicated: nothing to refuse at build."""
    with pytest.raises(ValueError, match=r"Replicated\(pack_bytes=-1\).*>= 0"):
        towerlib.Replicated(pack_bytes=-1)
    with pytest.raises(ValueError, match=r"Replicated\(wire_dtype='float64'\)"):
        towerlib.Replicated(wire_dtype="float64")
    assert towerlib.Replicated(wire_dtype="float32").wire_dtype is None
    assert towerlib.Replicated(wire_dtype=tf.bfloat16).wire_dtype == "bfloat16"


def test_replicated_refuses_an_unknown_variable_update():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"update='mirrored'.*towerlib.Replicated"):
            helpers.build_on_image_batch(2, update="mirrored")


def test_replicated_refuses_a_trained_variable_made_outside_the_towers():
    with tf.Graph().as_default():
        outside = tf.compat.v1.get_variable("outside_scale", initializer=1.0)

        def model(inputs, ctx):
            return outside * helpers.conv_dense_model(inputs, ctx)

        with pytest.raises(ValueError, match="outside_scale"):
            helpers.build_on_image_batch(2, tower_fn=model, update="replicated",
                                         var_list=[outside])


def test_nccl_needs_every_tower_on_a_gpu():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="nccl"):
            towerlib.exchange.CrossTowerReducer(
                ["/device:GPU:0", "/device:CPU:0"], transport="collective",
                communication_hint="nccl")


def test_dynamic_batch_and_per_tower_inputs_match_parameter_server():
    batch = helpers.image_batch(11, seed=11)
    bounds = [(0, 4), (4, 8), (8, 11)]

    def per_tower(ctx):
        start, stop = bounds[ctx.index]
        return tuple(tf.constant(x[start:stop]) for x in batch)

    results = {}
    for variable_update in ("parameter_server", "replicated"):
        for source in ("fed", "per_tower"):
            graph = tf.Graph()
            with graph.as_default():
                placeholders = tuple(
                    tf.compat.v1.placeholder(tf.as_dtype(x.dtype), [None] + list(x.shape[1:]))
                    for x in batch)
                inputs = placeholders if source == "fed" else per_tower
                train = towerlib.build_train_graph(
                    helpers.conv_dense_model, inputs, _optimizer("momentum"),
                    devices=helpers.cpu_devices(3), update=variable_update)
                start = _start_values()
                with tf.compat.v1.Session(config=towerlib.session_config(3)) as session:
                    session.run(tf.compat.v1.global_variables_initializer())
                    helpers.load_values(session, _model_variables(), start)
                    session.run(tf.compat.v1.local_variables_initializer())
                    for _ in range(3):
                        session.run(train.train_op, dict(zip(placeholders, batch)))
                    results[variable_update, source] = _saved_values(session)
    for source in ("fed", "per_tower"):
        _assert_close(results["replicated", source], results["parameter_server", source])


def test_ema_and_numerics_guard_work_with_copies(tmp_path):
    batch = helpers.image_batch(8, seed=12)
    with tf.Graph().as_default():
        inputs = tuple(tf.constant(x) for x in batch)
        guarded = towerlib.guard_numerics(_optimizer("momentum"), check_gradients=True)
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, inputs, guarded, devices=helpers.cpu_devices(2),
            update="replicated", ema_decay=0.9)
        assert train.numerics_guards == (guarded,)
        result = towerlib.run_training(train, train_dir=str(tmp_path), max_steps=3,
                                       session_config=towerlib.session_config(2),
                                       save_summaries_steps=None)
        assert result.global_step == 3
    reader = tf.train.load_checkpoint(towerlib.find_restorable_checkpoint(str(tmp_path)))
    names = reader.get_variable_to_shape_map()
    assert "conv1/weights/ExponentialMovingAverage" in names
    assert not [name for name in names if name.startswith("replicated/")]


def test_copies_live_on_their_towers_devices():
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(
            3, tower_fn=helpers.conv_dense_model, optimizer_kind="momentum",
            update="replicated")
        for name, copies in train.variable_copies.items():
            for tower, copy in enumerate(copies):
                assert tf.DeviceSpec.from_string(copy.device).device_index == tower, (
                    name, tower, copy.device)


def test_sync_copies_op_repairs_a_restore_after_the_copies_were_initialized(tmp_path):
    """The TF 1 order 'init global, init local, restore' leaves the copies at
    their old values; TrainGraph.sync_copies_op copies tower 0's into them."""
    batch = helpers.image_batch(8, seed=13)
    with tf.Graph().as_default():
        inputs = tuple(tf.constant(x) for x in batch)
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, inputs, _optimizer("momentum"),
            devices=helpers.cpu_devices(2), update="replicated")
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            session.run(train.train_op)
            prefix = saver.save(session, str(tmp_path / "model"))
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            saver.restore(session, prefix)
            tower_0, tower_1 = session.run(train.variable_copies["conv1/weights"])
            assert not np.array_equal(tower_0, tower_1)  # apart, as the review found
            session.run(train.sync_copies_op)
            for name, copies in train.variable_copies.items():
                values = session.run(copies)
                for value in values[1:]:
                    np.testing.assert_array_equal(value, values[0], err_msg=name)


def test_built_inside_a_variable_scope_only_tower_0_is_saved_and_slots_are_copies():
    batch = helpers.image_batch(8, seed=14)
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("model"):
            inputs = tuple(tf.constant(x) for x in batch)
            train = towerlib.build_train_graph(
                helpers.conv_dense_model, inputs, _optimizer("adam"),
                devices=helpers.cpu_devices(2), update="replicated")
        saved = [v.op.name for v in tf.compat.v1.global_variables()]
        assert not [name for name in saved if "replicated/tower_" in name], saved
        slots = [name for name in train.variable_copies if name.endswith(("Adam", "Adam_1"))]
        assert len(slots) == 12 and all(len(train.variable_copies[s]) == 2 for s in slots)


def test_tutorial_weight_decay_in_every_tower_works_with_copies():
    """Each tower's 'losses' weight decay reads its own copy: the same term."""
    def model(inputs, ctx):
        images, labels = inputs
        with tf.compat.v1.variable_scope("fc"):
            weights = tf.compat.v1.get_variable(
                "weights", [72, 3], initializer=tf.compat.v1.constant_initializer(0.1))
        logits = tf.matmul(tf.reshape(images, [-1, 72]), weights)
        tf.compat.v1.add_to_collection("losses", 0.01 * tf.nn.l2_loss(weights))
        tf.compat.v1.add_to_collection("losses", tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)))
        return tf.add_n(tf.compat.v1.get_collection("losses", ctx.name_scope))

    batch = helpers.image_batch(8, seed=15)
    results = {}
    for variable_update in ("parameter_server", "replicated"):
        with tf.Graph().as_default():
            inputs = tuple(tf.constant(x) for x in batch)
            train = towerlib.build_train_graph(
                model, inputs, _optimizer("sgd"), devices=helpers.cpu_devices(2),
                update=variable_update)
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(tf.compat.v1.local_variables_initializer())
                results[variable_update] = session.run(
                    [train.loss, train.regularization_loss])
    np.testing.assert_allclose(results["replicated"], results["parameter_server"], rtol=1e-6)
    assert results["replicated"][1] > 0


def test_initialize_prepares_every_copy_for_a_plain_session():
    """One call, no ordering of initializers to remember."""
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(3, update="replicated")
        with tf.compat.v1.Session(config=towerlib.session_config(3)) as session:
            train.initialize(session)
            session.run(train.train_op)
            copies = {name: session.run(variables)
                      for name, variables in train.variable_copies.items()}
    for name, values in copies.items():
        for value in values[1:]:
            np.testing.assert_array_equal(values[0], value, err_msg=name)
