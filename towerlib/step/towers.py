"""Building the tower function once per device with one shared set of variables.

Tower i runs under name scope 'tower_i' on its device, inside one variable
scope that tower 0 creates variables in and every later tower reuses. All
the towers are built before any of them runs: the Python loop builds a graph,
and the session runs the towers in parallel.
"""

import dataclasses
import functools
import re
from typing import Any, Dict, List, Optional

import tensorflow as tf

from towerlib.batchnorm import keras_layers
from towerlib.checks import tower_batch, tower_isolation
from towerlib.internals import error_texts
from towerlib.step import devices as devices_lib
from towerlib.step import inputs as inputs_lib
from towerlib.step.context import TowerContext, TowerRecords
from towerlib.update import copies as variable_copies


class TowerModel:
    """Base class for a model written once and replicated on every tower.

    Subclasses implement `build(inputs, ctx)`, returning the tower's loss: a
    float scalar, the mean over THIS tower's examples (towerlib weights the
    towers so that the step's objective is the mean over the global batch).
    A dict with a 'loss' entry may be returned instead, to hand other tensors
    (logits, accuracy) back per tower.
    """

    def build(self, inputs, ctx):
        raise NotImplementedError(
            f"{type(self).__name__} must implement build(self, inputs, ctx) and "
            "return the tower's scalar loss.")

    def __call__(self, inputs, ctx):
        return self.build(inputs, ctx)


@dataclasses.dataclass
class Tower:
    """What one tower built.

    Attributes:
      context: the tower's TowerContext (its batch_size is set).
      inputs: the tower's shard of the inputs (a nest of tensors).
      result: whatever the tower function returned.
      loss: the scalar loss (None for a forward-only build without a loss).
      outputs: the other entries of a dict result, else {}.
      update_ops: ops the tower added to UPDATE_OPS in its own name scope
        (user ops; towerlib batch norm reports through TowerRecords instead).
    """

    context: TowerContext
    inputs: Any
    result: Any
    loss: Optional[tf.Tensor]
    outputs: Dict[str, Any]
    update_ops: List[tf.Operation]


def as_tower_fn(tower_fn):
    """The callable (inputs, ctx) -> loss of a TowerModel or a callable; else TypeError.

    The `tower_fn` option's one check (towerlib.validate_config runs it too).
    """
    if isinstance(tower_fn, TowerModel):
        return tower_fn.build
    if isinstance(tower_fn, type) and issubclass(tower_fn, TowerModel):
        raise TypeError(
            f"tower_fn is the class {tower_fn.__name__}, not an instance. Fix: pass "
            f"{tower_fn.__name__}(), not {tower_fn.__name__}.")
    if not callable(tower_fn):
        raise TypeError(
            f"tower_fn must be a towerlib.TowerModel or a callable (inputs, ctx) -> loss, "
            f"got {type(tower_fn).__name__}. Fix: pass the function that builds one "
            "tower's loss.")
    return tower_fn


def _split_result(result, tower_index, require_loss):
    """(loss, outputs) from what the tower function returned, validated."""
    outputs = {}
    loss = result
    if isinstance(result, dict):
        if "loss" not in result and require_loss:
            raise ValueError(
                f"Tower {tower_index}'s function returned a dict without a 'loss' "
                f"entry (keys: {sorted(result)}). Put the tower's scalar loss under "
                "'loss'.")
        outputs = {k: v for k, v in result.items() if k != "loss"}
        loss = result.get("loss")
    if not require_loss and loss is None:
        return None, outputs
    if not isinstance(loss, tf.Tensor):
        if require_loss:
            raise TypeError(
                f"Tower {tower_index}'s function returned {type(loss).__name__}, "
                "not a tf.Tensor. It must return the tower's loss as a scalar "
                "float tensor (the mean over this tower's examples), or a dict "
                "with such a 'loss' entry.")
        return None, outputs if isinstance(result, dict) else {}
    if not loss.dtype.is_floating:
        raise TypeError(
            f"Tower {tower_index}'s loss {loss.name} has dtype {loss.dtype.name}; "
            "a loss must be a float tensor.")
    if loss.shape.rank is None:
        # Unknown at build time: checked at the first step, before it trains.
        check = tf.debugging.assert_rank(
            loss, 0, message=(
                f"Tower {tower_index}'s loss must be a scalar, the mean over its "
                "examples (e.g. tf.reduce_mean(per_example_loss)); at run time it "
                "is not"))
        with tf.control_dependencies([check]):
            loss = tf.identity(loss)
    elif loss.shape.rank != 0:
        raise ValueError(
            f"Tower {tower_index}'s loss {loss.name} has shape {loss.shape}, not a "
            "scalar. Return the mean over this tower's examples, e.g. "
            "tf.reduce_mean(per_example_loss).")
    return loss, outputs


def _global_variable_set():
    return set(tf.compat.v1.global_variables()) | set(tf.compat.v1.local_variables())


def _nested_getter(outer, inner):
    """`inner` as a custom getter inside an enclosing scope's getter `outer`."""
    if outer is None:
        return inner
    return lambda getter, *args, **kwargs: inner(
        functools.partial(outer, getter), *args, **kwargs)


def build_towers(tower_fn, inputs, *, num_towers=None, devices=None,
                 device_type=None, is_training=True, bn_mode="first_tower", param_device="cpu",
                 reuse_variables=False, records=None, cross_tower=None,
                 require_loss=True, check_isolation=True, variable_getter=None,
                 micro_batch=0):
    """Builds `tower_fn` once per device and returns what each tower made.

    Public (towerlib.build_towers) for custom steps: it takes the tower-related
    options of build_train_graph by the same names.

    Args:
      tower_fn: a TowerModel or a callable (inputs, ctx) -> loss or dict.
      inputs: the global batch, a nest of tensors split along axis 0 across
        the towers (uneven when not divisible); or a callable input_fn(ctx)
        returning tower ctx.index's own batch, built on the tower's host CPU.
      num_towers / devices: how many towers, or their exact device strings.
      device_type: 'gpu', 'cpu' or None (GPUs when the machine has them).
      is_training: layers' mode (batch statistics and dropout, or not).
      bn_mode: see towerlib.batch_norm.
      param_device: 'cpu', 'gpu' or a device function for the variables.
      reuse_variables: True when the variables already exist (an evaluation
        graph next to a training graph); then no tower creates any.
      records: the TowerRecords the towers report into (a new one if None).
      cross_tower: the cross-tower reducer for bn_mode='sync'.
      require_loss: whether the tower function must return a loss.
      check_isolation: refuse a tower whose loss reads another tower's
        examples (towerlib.checks.tower_isolation; e.g. a collection read without
        the tower's scope). False only for a deliberate cross-tower design.
      variable_getter: None, or a function tower index -> custom getter for
        that tower's variable scope (replicated variables give each tower its
        own copies this way: towerlib.update.copies).
      micro_batch: which micro-batch of an accumulated step these towers
        build (TowerContext.micro_batch); 0 without accumulation.

    Returns:
      (towers, records): a list of `Tower`, and the TowerRecords.

    Raises:
      TowerIsolationError: a tower's loss depends on another tower's examples.
      BatchSizeMismatchError: a tower uses the global batch size where its
        own belongs (e.g. a reshape hard-coding the tutorial's per-GPU batch).
    """
    devices = devices_lib.resolve_devices(num_towers, devices, device_type)
    plan = _TowerPlan(
        tower_fn=as_tower_fn(tower_fn), devices=devices,
        placer=devices_lib.variable_placer(param_device, devices),
        records=records if records is not None else TowerRecords(len(devices)),
        is_training=is_training, bn_mode=bn_mode, cross_tower=cross_tower,
        micro_batch=micro_batch, require_loss=require_loss,
        reuse_variables=reuse_variables, copies=variable_getter is not None,
        batches=_TowerBatches.of(inputs, devices))
    towers = []
    outer_scope = tf.compat.v1.get_variable_scope()
    with tf.compat.v1.variable_scope(
            outer_scope, reuse=True if reuse_variables else None) as var_scope:
        outer_getter = var_scope.custom_getter
        for index, device in enumerate(devices):
            if index > 0:
                var_scope.reuse_variables()
            if variable_getter is not None:
                var_scope.set_custom_getter(
                    _nested_getter(outer_getter, variable_getter(index)))
            towers.append(_build_tower(plan, index, device, towers))
    if check_isolation:
        tower_isolation.check_tower_isolation(towers)
    return towers, plan.records


@dataclasses.dataclass(frozen=True)
class _TowerBatches:
    """Each tower's examples: shards of a global batch, or an input function's own batch."""

    input_fn: Any = None
    shards: Any = None
    sizes: Any = None
    global_batch: Optional[int] = None  # B when known while building

    @classmethod
    def of(cls, inputs, devices):
        if callable(inputs):
            return cls(input_fn=inputs)
        shards, sizes = inputs_lib.split_global_batch(
            inputs, len(devices), host_device=devices_lib.host_cpu(devices[0]))
        static_sizes = [tower_batch.static_int(size) for size in sizes]
        return cls(shards=shards, sizes=sizes,
                   global_batch=None if None in static_sizes else sum(static_sizes))

    def for_tower(self, ctx, built):
        """(the tower's inputs, its batch size tensor, B or None)."""
        if self.input_fn is None:
            return self.shards[ctx.index], self.sizes[ctx.index], self.global_batch
        with tf.device(devices_lib.host_cpu(ctx.device)), tf.name_scope("input"):
            tower_inputs = self.input_fn(ctx)
            inputs_lib.check_same_structure(tower_inputs, ctx.index, built)
            batch_size = inputs_lib.leading_batch_size(tower_inputs)
        static = tower_batch.static_int(batch_size)  # B if every tower gets as many
        return tower_inputs, batch_size, None if static is None else static * ctx.num_towers


@dataclasses.dataclass(frozen=True)
class _TowerPlan:
    """What every tower of one build_towers call shares."""

    tower_fn: Any
    devices: List[str]
    placer: Any
    records: TowerRecords
    is_training: bool
    bn_mode: Any  # a BnMode or its name: each TowerContext resolves it
    cross_tower: Any
    micro_batch: int
    require_loss: bool
    reuse_variables: bool
    copies: bool  # replicated: each tower creates its own copies
    batches: _TowerBatches


def _build_tower(plan, index, device, built):
    """Tower `index`: its scopes, context, inputs and the tower function's result."""
    variables_before = _global_variable_set()
    device_fn = devices_lib.tower_device_function(device, plan.placer)
    with tf.name_scope(f"tower_{index}") as name_scope, tf.compat.v1.device(device_fn):
        ctx = TowerContext(
            index=index, num_towers=len(plan.devices), device=device,
            is_training=plan.is_training, bn_mode=plan.bn_mode, name_scope=name_scope,
            records=plan.records, cross_tower=plan.cross_tower, micro_batch=plan.micro_batch)
        tower_inputs, batch_size, global_batch = plan.batches.for_tower(ctx, built)
        ctx = dataclasses.replace(ctx, batch_size=batch_size)
        static_batch = tower_batch.static_int(batch_size)
        graph = tf.compat.v1.get_default_graph()
        ops_before = len(graph.get_operations())
        result = _call_tower(plan, ctx, tower_inputs, (ops_before, static_batch, global_batch))
        loss, outputs = _split_result(result, index, plan.require_loss)
        tower_batch.check_reshapes(ctx, graph.get_operations()[ops_before:],
                                   static_batch, global_batch)
    _check_created_variables(_global_variable_set() - variables_before, index, plan)
    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, name_scope)
    return Tower(ctx, tower_inputs, result, loss, outputs, update_ops)


def _call_tower(plan, ctx, tower_inputs, batch_facts):
    """The tower function's result; a ValueError explained in towerlib's terms if it can be."""
    ops_before, static_batch, global_batch = batch_facts
    try:
        with keras_layers.keras_batch_norm_in(ctx):
            return plan.tower_fn(tower_inputs, ctx)
    except ValueError as error:
        new_ops = tf.compat.v1.get_default_graph().get_operations()[ops_before:]
        explained = tower_batch.explain_shape_error(
            error, ctx, new_ops, static_batch, global_batch)
        if explained is not None:
            raise explained from error
        if ctx.index > 0 and error_texts.is_missing_variable(error):
            created = re.search(r"Variable (\S+) does not exist", str(error))
            raise ValueError(
                f"Tower {ctx.index} tried to create a variable "
                f"{created.group(1) if created else ''} that tower 0 "
                "did not create. Fix: every variable must be created by "
                "tower 0 and reused by later towers: do not create "
                "variables conditionally on ctx.index, and give layers "
                f"fixed names.\nTensorFlow: {error}") from error
        if ctx.index == 0 and error_texts.is_existing_variable(error):
            existing = re.search(r"Variable (\S+) already exists", str(error))
            raise ValueError(
                f"Variable {existing.group(1) if existing else ''} already exists in "
                "this graph: a second build in the same graph, or two layers with one "
                "name. Fix: build each training graph in its own tf.Graph(); build "
                "evaluation next to training with build_eval_graph(..., "
                "reuse_variables=True); or give the layer another name.") from error
        if plan.reuse_variables and error_texts.is_missing_variable(error):
            raise ValueError(
                "reuse_variables=True, but the tower function asked for a "
                f"variable that does not exist yet: {error}") from error
        raise


def _check_created_variables(created, index, plan):
    """Refuses variables a tower made that it should have reused (its own copies aside)."""
    if plan.copies and index:
        own_copies = variable_copies.copy_name("", index)
        created = {v for v in created if not v.op.name.startswith(own_copies)}
    if created and (index > 0 or plan.reuse_variables):
        names = sorted(v.name for v in created)
        raise ValueError(
            f"Tower {index} created variable(s) {names} that "
            f"{'tower 0 did not' if index else 'should already exist'}. "
            "Create variables with tf.compat.v1.get_variable (towerlib "
            "layers do) so that later towers reuse tower 0's; tf.Variable "
            "always makes a new one.")
