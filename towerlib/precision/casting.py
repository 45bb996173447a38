"""Mixed precision: compute in float16/bfloat16, keep the weights in float32.

A tower computes its activations in a *compute dtype* (float16 on GPUs with
tensor cores, bfloat16 on TPUs, recent GPUs and CPUs) while every trainable
variable is *stored* in float32. Each tower reads a weight through a cast to
the compute dtype, so the gradient reaching the variable comes back through
the cast as float32; the towers' gradients are summed and applied in float32,
and small updates (lr * g, often below float16's resolution of 2**-11
relative) are not lost. Loss scaling for float16 is towerlib.precision.loss_scaling.

The pieces, each one job:

  check_compute_dtype(name)             'float16' -> tf.float16; refuses the rest
  cast_inputs(nest, dtype)              float tensors of a batch -> dtype; int labels kept
  float32_storage_getter(dtype)         custom getter: trainable variables in float32,
                                        read as `dtype`
  loss_to_float32(loss)                 the tower's loss back in float32
  compute_in(tower_fn, dtype)           all of the above around a tower function

Worked example, one tower function, float16 (shapes in comments):

    def tower_fn(inputs, ctx):
        images, labels = inputs                      # [N, 32, 32, 3] float16, [N] int32
        h = layers.conv2d(images, 16, 3, name="conv1")   # asks for 'conv1/weights' as
                                                     # float16: stored [3, 3, 3, 16]
                                                     # float32, read through a Cast
        h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn1"))  # [N, 32, 32, 16] float16;
                                                     # statistics in float32, moving
                                                     # mean/variance float32 (not trainable,
                                                     # returned as they are)
        logits = layers.dense(layers.global_avg_pool2d(h), 10, name="logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))           # float16 scalar

    model = mixed_precision.compute_in(tower_fn, "float16")
    loss = model((images32, labels), ctx)            # float32 scalar
    # global_variables(): conv1/weights float32 [3, 3, 3, 16], conv1/biases
    # float32 [16], bn1/{beta, gamma, moving_mean, moving_variance} float32 [16],
    # logits/weights float32 [16, 10], logits/biases float32 [10];
    # tf.gradients(loss, conv1/weights) is float32 [3, 3, 3, 16].

Wiring into build_train_graph (a few lines; `compute_dtype` a new option):

    compute_dtype = mixed_precision.check_compute_dtype(compute_dtype)
    tower_fn = mixed_precision.compute_in(tower_fn, compute_dtype)
    ... build_towers(tower_fn, ...) as today ...

`compute_in` opens the tower's variable scope again with the storage getter,
so it sits *in front of* the getter build_towers already set for the tower
(replicated variables' per-tower copies, towerlib.update.copies): it asks
that getter for a float32 variable and casts what comes back. Nothing else
in the build changes: var_list, gradients, their sum, the optimizer, the
checkpoints all see float32 variables only. The casts run on the tower's
device, so a weight crosses to the tower in float32 and is cast there.

Precision notes. Variables the model asks for without a dtype (float32, the
default; towerlib.batch_norm's beta and gamma) are read in the compute dtype
too, so that user layers written for float32 work unchanged; batch norm casts
them back to float32 for its arithmetic, so its gamma and beta are rounded to
the compute dtype once per read (2**-11 relative in float16, 2**-8 in
bfloat16), like every other weight; the float32 copy that the optimizer
updates keeps full precision. Non-trainable variables (moving statistics,
counters) are returned exactly as they are.
"""

import contextlib
import dataclasses
import threading

import tensorflow as tf

from towerlib.internals import error_texts

__all__ = ["COMPUTE_DTYPES", "cast_inputs", "check_compute_dtype", "compute_in",
           "float32_storage_getter", "loss_to_float32", "weights_read_as_stored"]

COMPUTE_DTYPES = ("float32", "float16", "bfloat16")

_STORED_AS_FLOAT32 = (tf.float32, tf.float16, tf.bfloat16)

_as_stored = threading.local()  # .depth > 0: the storage getter returns variables uncast


@contextlib.contextmanager
def weights_read_as_stored():
    """While open, in this thread, float32_storage_getter hands back the float32
    variable itself, uncast: for a model that casts its own weights (a Keras
    mixed-precision policy reads each through an AutoCastVariable)."""
    _as_stored.depth = getattr(_as_stored, "depth", 0) + 1
    try:
        yield
    finally:
        _as_stored.depth -= 1


def check_compute_dtype(name):
    """The compute dtype as a tf.DType: tf.float32, tf.float16 or tf.bfloat16.

    Args:
      name: one of COMPUTE_DTYPES as a string, or the tf.DType itself.

    Raises:
      ValueError: anything else (float64, an integer type, a typo), naming
        the choices and which one to take.
    """
    # Strings must be the names themselves: tf.as_dtype also takes aliases
    # ('half', 'float'), which a config file would then record under another name.
    dtype = None
    if isinstance(name, tf.DType) or (isinstance(name, str) and name in COMPUTE_DTYPES):
        dtype = tf.as_dtype(name)
    if dtype is None or dtype.name not in COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype must be one of {COMPUTE_DTYPES}, got {name!r} (or pass "
            "towerlib.Float32(), towerlib.BFloat16(), towerlib.Float16()). Fix: "
            "'float32' for full precision; 'bfloat16' on TPUs, GPUs from A100 on "
            "and CPUs (float32's range, no loss scaling needed); 'float16' on GPUs "
            "with float16 tensor cores (V100, T4), with loss scaling "
            "(towerlib.precision.loss_scaling). The weights stay float32 in every case.")
    return dtype


def cast_inputs(nest, compute_dtype):
    """`nest` with every floating-point tensor cast to `compute_dtype`.

    Args:
      nest: a tensor, or a tuple/list/dict nest of them (a tower's batch,
        e.g. (images [N, H, W, C] float32, labels [N] int32)).
      compute_dtype: one of COMPUTE_DTYPES.

    Returns:
      The same structure: float tensors (float32 or float64 images) as
      `compute_dtype`, everything else (int labels, ids, bools, Python
      values) untouched, so that the labels of a cross-entropy keep their type.
    """
    compute_dtype = check_compute_dtype(compute_dtype)

    def cast(value):
        if tf.is_tensor(value) and value.dtype.is_floating and value.dtype != compute_dtype:
            return tf.cast(value, compute_dtype)
        return value

    return tf.nest.map_structure(cast, nest)


def loss_to_float32(loss):
    """The loss as float32 (a half-precision loss cast; a float32 one as it is).

    Loss scaling, the towers' weighting by n_i / B, regularization and the
    summaries all work on a float32 objective; a float16 loss would round
    the sum to 11 bits and overflow past 65504.
    """
    loss = tf.convert_to_tensor(loss)
    return loss if loss.dtype == tf.float32 else tf.cast(loss, tf.float32)


def float32_storage_getter(compute_dtype):
    """A custom getter storing trainable variables in float32, read in `compute_dtype`.

    Use it as a variable scope's custom getter:

        with tf.compat.v1.variable_scope(scope, custom_getter=float32_storage_getter("float16")):
            w = tf.compat.v1.get_variable("w", [3, 4], dtype=tf.float16)
            # w: a float16 [3, 4] tensor, Cast of the float32 variable 'w'

    What the getter returns, by request:

      trainable, asked in float16, bfloat16 or float32 (towerlib's layers ask
          for dtype=x.dtype; get_variable's default is float32):
          the variable is created (or reused) in float32 and returned as a
          tensor cast to `compute_dtype`; with compute_dtype float32 the
          float32 variable itself. Its gradient through the cast is float32.
      non-trainable (moving statistics, counters), or another dtype (float64,
          ints): returned exactly as the next getter makes it.

    Composition: TensorFlow calls the getter as `getter(next_getter, name,
    **kwargs)`. This one calls `next_getter` with dtype=float32 and casts
    what it returns, so another custom getter (replicated variables' copies,
    a placement getter) behind it sees, creates and returns float32
    variables only. Enter the scope with this getter *inside* the other's:
    TensorFlow calls the innermost scope's getter first.

    Args:
      compute_dtype: one of COMPUTE_DTYPES.

    Returns:
      The getter, a function (getter, name, *args, **kwargs) -> variable or tensor.
    """
    compute_dtype = check_compute_dtype(compute_dtype)

    def storage_getter(getter, name, *args, **kwargs):
        requested = tf.as_dtype(kwargs.get("dtype") or tf.float32)
        trainable = kwargs.get("trainable")
        trainable = True if trainable is None else trainable  # get_variable's default
        if not trainable or requested.base_dtype not in _STORED_AS_FLOAT32:
            return getter(name, *args, **kwargs)
        kwargs["dtype"] = tf.float32
        variable = getter(name, *args, **kwargs)
        if compute_dtype == tf.float32 or variable.dtype.base_dtype != tf.float32 \
                or getattr(_as_stored, "depth", 0):
            return variable
        return tf.cast(variable, compute_dtype, name=_cast_name(name, compute_dtype))

    return storage_getter


def _cast_name(variable_name, compute_dtype):
    """'conv1/weights' -> 'weights_float16' (the op sits in the caller's name scope)."""
    return f"{variable_name.rsplit('/', 1)[-1]}_{compute_dtype.name}"


def compute_in(tower_fn, compute_dtype):
    """`tower_fn` computing in `compute_dtype` on float32 variables, float32 loss out.

    The returned function (inputs, ctx) -> result does three things around
    the original:

      1. cast_inputs(inputs, compute_dtype): images [N, ...] to the compute
         dtype, labels untouched; the tower's ctx says the dtype
         (ctx.compute_dtype);
      2. builds the tower in the current variable scope re-entered with
         float32_storage_getter in front of whatever getter the scope has
         (reuse and names are the scope's own, so tower 1 reuses tower 0's
         float32 variables);
      3. loss_to_float32 on the loss: a scalar result, or the 'loss' entry of
         a dict result (the dict's other entries stay in the compute dtype).

    With compute_dtype float32 it returns `tower_fn` unchanged.

    Args:
      tower_fn: a towerlib.TowerModel or a callable (inputs, ctx) -> loss or dict.
      compute_dtype: one of COMPUTE_DTYPES.
    """
    compute_dtype = check_compute_dtype(compute_dtype)
    if not callable(tower_fn):
        raise TypeError(f"compute_in takes a tower function (inputs, ctx) -> loss or a "
                        f"towerlib.TowerModel, got {type(tower_fn).__name__}.")
    build = tower_fn  # a TowerModel is called as its build
    if compute_dtype == tf.float32:
        return build
    getter = float32_storage_getter(compute_dtype)

    def tower_in_compute_dtype(inputs, ctx):
        scope = tf.compat.v1.get_variable_scope()
        with tf.compat.v1.variable_scope(scope, custom_getter=getter,
                                         auxiliary_name_scope=False):
            try:
                result = build(cast_inputs(inputs, compute_dtype),
                               dataclasses.replace(ctx, compute_dtype=compute_dtype))
            except TypeError as error:
                if not error_texts.is_fused_batch_norm_dtype(error):
                    raise
                raise TypeError(
                    f"Tower {ctx.index}: a fused batch norm (tf.compat.v1.layers."
                    f"batch_normalization or tf.nn.fused_batch_norm) cannot compute in "
                    f"{compute_dtype.name}: its scale and offset are read cast to "
                    f"{compute_dtype.name} while its statistics stay float32. Fix: swap in "
                    "towerlib's, `tfl = towerlib.layers.for_tower(ctx)` then "
                    "`tfl.batch_normalization(...)` (same arguments and variables), or "
                    "towerlib.batch_norm(x, ctx, name=...).") from error
        if isinstance(result, dict):
            result = dict(result)
            if "loss" in result:
                result["loss"] = loss_to_float32(result["loss"])
            return result
        return loss_to_float32(result) if result is not None else result

    return tower_in_compute_dtype
