"""Mixed precision: float16/bfloat16 compute on float32 variables (towerlib.precision.casting)."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import half_precision
from towerlib import layers
from towerlib.precision import casting as mixed_precision
from towerlib.update import copies as variable_copies


def _model(inputs, ctx):
    """[8, 6, 6, 2] images -> conv, batch norm, relu, dense -> 3 classes."""
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn1"))
    logits = layers.dense(layers.flatten(layers.max_pool2d(h, 2, 2)), 3, name="logits")
    return {"loss": tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits)), "activation": h}


def _batch():
    rng = np.random.RandomState(0)
    return (rng.randn(8, 6, 6, 2).astype(np.float32),
            rng.randint(0, 3, 8).astype(np.int32))


def _initial_values(variables):
    values = {}
    for index, variable in enumerate(sorted(variables, key=lambda v: v.op.name)):
        if variable.op.name.endswith(("weights", "biases")):
            rng = np.random.RandomState(index)
            values[variable.op.name] = (0.3 * rng.randn(*variable.shape.as_list())
                                        ).astype(np.float32)
    return values


def _train_one_step(compute_dtype):
    """One SGD step of _model in compute_dtype from fixed weights: what it saw and did."""
    with tf.Graph().as_default():
        model = mixed_precision.compute_in(_model, compute_dtype)
        result = model(tuple(tf.constant(x) for x in _batch()),
                       towerlib.TowerContext.single(is_training=True))
        weights = tf.compat.v1.trainable_variables()
        gradients = tf.gradients(result["loss"], weights)
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(updates):
            step = tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients(
                zip(gradients, weights))
        variables = tf.compat.v1.global_variables()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for variable in variables:
                if variable.op.name in _initial_values(variables):
                    variable.load(_initial_values(variables)[variable.op.name], session)
            before = session.run({v.op.name: v for v in variables})
            grads = session.run({v.op.name: g for v, g in zip(weights, gradients)})
            session.run(step)
            after = session.run({v.op.name: v for v in variables})
        return {"dtypes": {v.op.name: v.dtype.base_dtype for v in variables},
                "gradient_dtypes": {v.op.name: g.dtype for v, g in zip(weights, gradients)},
                "loss_dtype": result["loss"].dtype, "activation_dtype": result["activation"].dtype,
                "before": before, "after": after, "gradients": grads}


@pytest.fixture(scope="module")
def float32_run():
    return _train_one_step("float32")


@pytest.mark.half_precision
@pytest.mark.parametrize("compute_dtype", ["float16", "bfloat16"])
def test_half_compute_on_float32_variables(compute_dtype, float32_run):
    """Each gradient within 16 u of the largest float32 gradient of its variable (16
    roundings on the path, tests/half_precision.py: float16 7.8e-3, bfloat16 6.3e-2;
    measured 3.8e-3 and 1.6e-2, the same under both oneDNN settings). The moving
    statistics within 16 u relative, and 16 u of how far they moved in float32."""
    tolerance = half_precision.PATH_ROUNDINGS * half_precision.unit_roundoff(compute_dtype)
    run = _train_one_step(compute_dtype)
    assert set(run["dtypes"]) == {"conv1/weights", "bn1/beta", "bn1/gamma", "bn1/moving_mean",
                                  "bn1/moving_variance", "logits/weights", "logits/biases"}
    assert set(run["dtypes"].values()) == {tf.float32}            # every variable
    assert set(run["gradient_dtypes"].values()) == {tf.float32}   # through the casts
    assert run["activation_dtype"] == tf.as_dtype(compute_dtype)
    assert run["loss_dtype"] == tf.float32
    for name in ("bn1/moving_mean", "bn1/moving_variance"):       # updated, in float32
        assert not np.allclose(run["after"][name], run["before"][name]), name
        moved = np.max(np.abs(float32_run["after"][name] - float32_run["before"][name]))
        np.testing.assert_allclose(run["after"][name], float32_run["after"][name],
                                   rtol=tolerance, atol=tolerance * moved, err_msg=name)
    for name, gradient in run["gradients"].items():
        reference = float32_run["gradients"][name]
        # Relative to the gradient's size: one number per variable.
        error = np.max(np.abs(gradient - reference)) / np.max(np.abs(reference))
        assert error < tolerance, (name, error)
        assert not np.array_equal(run["after"][name], run["before"][name]), name


def test_float32_compute_leaves_the_model_alone(float32_run):
    assert set(float32_run["dtypes"].values()) == {tf.float32}
    assert float32_run["activation_dtype"] == tf.float32
    assert mixed_precision.compute_in(_model, tf.float32) is _model


def test_getter_returns_non_trainable_and_other_dtypes_as_they_are():
    with tf.Graph().as_default():
        getter = mixed_precision.float32_storage_getter("bfloat16")
        with tf.compat.v1.variable_scope("m", custom_getter=getter):
            weights = tf.compat.v1.get_variable("w", [2], dtype=tf.float16)
            default = tf.compat.v1.get_variable("d", [2])
            count = tf.compat.v1.get_variable("count", [], dtype=tf.int64, trainable=False,
                                              initializer=tf.compat.v1.zeros_initializer())
            moving = tf.compat.v1.get_variable("moving", [2], dtype=tf.float16,
                                               trainable=False)
            wide = tf.compat.v1.get_variable("wide", [2], dtype=tf.float64)
        assert weights.dtype == tf.bfloat16 and default.dtype == tf.bfloat16
        assert isinstance(weights, tf.Tensor) and weights.op.type == "Cast"
        assert isinstance(count, tf.Variable) and count.dtype.base_dtype == tf.int64
        assert isinstance(moving, tf.Variable) and moving.dtype.base_dtype == tf.float16
        assert isinstance(wide, tf.Variable) and wide.dtype.base_dtype == tf.float64
        stored = {v.op.name: v.dtype.base_dtype for v in tf.compat.v1.global_variables()}
        assert stored == {"m/w": tf.float32, "m/d": tf.float32, "m/count": tf.int64,
                          "m/moving": tf.float16, "m/wide": tf.float64}
        stored_weights = tf.compat.v1.trainable_variables()[0]
        assert stored_weights.op.name == "m/w"
        assert tf.gradients(tf.reduce_sum(weights), stored_weights)[0].dtype == tf.float32


def test_getter_asks_the_getter_behind_it_for_float32():
    requests = []

    def recording_getter(getter, name, *args, **kwargs):
        requests.append((name, tf.as_dtype(kwargs["dtype"])))
        return getter(name, *args, **kwargs)

    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("outer", custom_getter=recording_getter):
            with tf.compat.v1.variable_scope(
                    "inner", custom_getter=mixed_precision.float32_storage_getter("float16")):
                weights = tf.compat.v1.get_variable("w", [3], dtype=tf.float16)
        assert requests == [("outer/inner/w", tf.float32)]
        assert weights.dtype == tf.float16


def test_compute_in_composes_with_replicated_copies():
    """Tower 1's copy is float32 too, read through its own cast."""
    copies = variable_copies.VariableCopies(2)
    model = mixed_precision.compute_in(
        lambda inputs, ctx: tf.reduce_sum(layers.dense(inputs, 2, name="fc")), "float16")
    with tf.Graph().as_default():
        x = tf.ones([4, 3])
        losses = []
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope()) as scope:
            for index in range(2):
                if index:
                    scope.reuse_variables()
                scope.set_custom_getter(copies.getter_for(index))
                with tf.name_scope(f"tower_{index}"):
                    losses.append(model(x, towerlib.TowerContext.single()))
        kernels = copies.copies_of("fc/weights")
        assert [k.op.name for k in kernels] == ["fc/weights", "replicated/tower_1/fc/weights"]
        assert all(k.dtype.base_dtype == tf.float32 for k in kernels)
        assert all(loss.dtype == tf.float32 for loss in losses)
        gradient = tf.gradients(losses[1], kernels[1])[0]
        assert gradient.dtype == tf.float32
        assert tf.gradients(losses[1], kernels[0])[0] is None  # tower 1 reads its own copy


def test_cast_inputs_casts_floats_only():
    with tf.Graph().as_default():
        batch = {"images": tf.zeros([2, 3]), "labels": tf.zeros([2], tf.int32),
                 "weights": tf.zeros([2], tf.float64), "name": "x"}
        cast = mixed_precision.cast_inputs(batch, "float16")
        assert cast["images"].dtype == tf.float16 and cast["weights"].dtype == tf.float16
        assert cast["labels"] is batch["labels"] and cast["name"] == "x"
        assert mixed_precision.loss_to_float32(tf.constant(1.0, tf.bfloat16)).dtype == tf.float32


@pytest.mark.parametrize("name", ["float64", "int32", "fp16", None])
def test_check_compute_dtype_names_the_choices_and_the_fix(name):
    with pytest.raises(ValueError, match=r"compute_dtype must be one of \('float32', "
                                         r"'float16', 'bfloat16'\).*Fix: "):
        mixed_precision.check_compute_dtype(name)


def test_check_compute_dtype_accepts_strings_and_dtypes():
    assert mixed_precision.check_compute_dtype("bfloat16") == tf.bfloat16
    assert mixed_precision.check_compute_dtype(tf.float16) == tf.float16
    assert mixed_precision.check_compute_dtype("float32") == tf.float32
