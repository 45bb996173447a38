"""What KerasTower checks of a model before it builds a tower from it.

Each check raises one line naming the problem and the fix: a Keras 3 object (no
graph mode), a model computing in another precision than the build's, a global Keras
policy that contradicts the build's, a model with every weight frozen.
"""

import tensorflow as tf

from towerlib.internals import tf_keras
from towerlib.keras.weights import KerasTowerError

__all__ = ["MIXED", "check_built_model", "check_global_policy", "check_model",
           "check_policy", "check_something_trains", "is_clonable"]

MIXED = {tf.bfloat16: "mixed_bfloat16", tf.float16: "mixed_float16"}


def check_policy(model, compute_dtype):
    """The model computes in the build's dtype, or is refused naming the one way.

    Layers of integer compute dtype (an int32 Input of token ids) do not
    count; a float32 layer inside a mixed model (a final softmax kept in
    float32, as Keras recommends) is allowed.
    """
    computed = {tf.as_dtype(d) for d in (tf_keras.compute_dtype_of(layer) for layer in
                [model] + list(model.submodules)) if d and tf.as_dtype(d).is_floating}
    half = computed & {tf.float16, tf.bfloat16}
    if compute_dtype == tf.float32 and half:
        (dtype,) = sorted(d.name for d in half)[:1]
        raise KerasTowerError(
            f"KerasTower: the model {model.name!r} computes in {dtype} (a Keras mixed-"
            f"precision policy) but the build's precision is float32. Fix: "
            f"precision=towerlib.{_PRECISION[dtype]}() (the policy then means the same), or "
            "build the model under the 'float32' policy.")
    if compute_dtype != tf.float32 and half != {compute_dtype}:
        seen = sorted(d.name for d in computed) or ["float32"]
        raise KerasTowerError(
            f"KerasTower: precision={_PRECISION[compute_dtype.name]}() but the model "
            f"{model.name!r} computes in {seen}: it was constructed under another Keras "
            "policy. Fix: give KerasTower a function that builds the model (towerlib calls "
            f"it under Keras' {MIXED[compute_dtype]!r} policy), or construct it after "
            f"tf_keras.mixed_precision.set_global_policy({MIXED[compute_dtype]!r}).")


_PRECISION = {"float32": "Float32", "bfloat16": "BFloat16", "float16": "Float16"}


def check_global_policy(policy):
    """A model function is built under the build's policy; a global Keras policy of the
    other half precision says the user meant another one: refused, not overridden."""
    name = tf_keras.global_policy_name()
    if policy is None or name == policy or name not in MIXED.values():
        return
    build = {v: k for k, v in MIXED.items()}[policy].name
    raise KerasTowerError(
        f"KerasTower: Keras' global policy is {name!r} but the build's precision is "
        f"{_PRECISION[build]}() ({policy!r}): the model function would compute in {build} "
        f"with no word. Fix: precision=towerlib.{_PRECISION[name.split('_')[1]]}(), or "
        "tf_keras.mixed_precision.set_global_policy('float32') and let towerlib choose.")


def check_something_trains(model):
    """A model whose weights are all frozen has nothing for the step to train."""
    if not model.weights or model.trainable_weights:
        return
    frozen = [w.name.split(":")[0] for w in model.weights]
    raise KerasTowerError(
        f"KerasTower: every weight of the model {model.name!r} is frozen (trainable = "
        f"False: {len(frozen)} weights, {', '.join(frozen[:3])}...), so the step has nothing "
        "to train. Fix: unfreeze the layers to train (layer.trainable = True, e.g. the "
        "classifier on a frozen base), or use build_eval_graph for inference only.")


def check_model(model):
    kind = tf_keras.keras3_kind(model)
    if kind is not None:
        raise TypeError(
            f"KerasTower got a Keras 3 {kind} ({type(model).__module__}."
            f"{type(model).__name__}); Keras 3 has no graph mode. Fix: build the model with "
            "tf_keras (pip install tf_keras; `import tf_keras`, and set "
            "TF_USE_LEGACY_KERAS=1 before importing TensorFlow if your code says tf.keras).")
    if tf_keras.is_keras2_model(model):
        return
    if callable(model) and not isinstance(model, tf.Module):
        return  # a function (or class) that builds the model
    raise TypeError(f"KerasTower's model must be a tf_keras.Model or a function that "
                    f"returns one, got {type(model).__name__}.")


def check_built_model(model):
    if not tf_keras.is_keras2_model(model):
        kind = tf_keras.keras3_kind(model)
        what = f"a Keras 3 {kind}" if kind else type(model).__name__
        raise TypeError(f"KerasTower's model function returned {what}, not a tf_keras.Model. "
                        "Fix: build it with tf_keras (Keras 3 has no graph mode).")


def is_clonable(model):
    keras = tf_keras.loaded()
    return isinstance(model, keras.Sequential) or getattr(model, "_is_graph_network", False)
