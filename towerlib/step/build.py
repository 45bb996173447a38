"""Assembling the training step: towers, their weighted objectives, one update.

One step consumes one global batch split over the towers (and, with
accumulation, over k micro-batches first). Each tower differentiates its own
term of the objective (towerlib.step.objective) on its own device; the
variable update sums the towers' gradients (towerlib.update) and applies
them once, under control dependencies of the chosen batch-norm updates
(the first tower's or every tower's, as bn_mode says). Options are objects checked before anything is built
(towerlib.step.options).
"""

import dataclasses
from typing import Any, List

import tensorflow as tf

from towerlib.batchnorm import foreign as foreign_batch_norm
from towerlib.checks import compute_dtypes
from towerlib.precision import casting, cpu_units, guards
from towerlib.step import accumulation, across_workers, micro_loop
from towerlib.step import apply as apply_step
from towerlib.step import devices as devices_lib
from towerlib.step import options as options_lib
from towerlib.step import summaries as summaries_lib
from towerlib.step import towers as towers_lib
from towerlib.step.context import TowerRecords
from towerlib.step.objective import StepObjective
from towerlib.step.train_graph import TrainGraph
from towerlib.update import clipping as clipping_lib

__all__ = ["build_train_graph"]


def build_train_graph(tower_fn, inputs, optimizer, *, num_towers=None, devices=None,
                      device_type=None, bn_mode="first_tower", update="parameter_server",
                      precision="float32", exchange=None, accumulation_steps=1,
                      global_step=None, ema_decay=None, learning_rate=None, var_list=None,
                      summaries=True, check_isolation=True, workers=None, clipping=None):
    """Builds the multi-tower training step.

    The options are keyword-only, each with a default, declared once in
    towerlib.step.options.STEP_OPTIONS (name, default, check, doc), which this
    signature follows; related choices are strategy objects (update,
    precision, exchange, clipping, bn_mode), the rest independent knobs.

    Args:
      tower_fn: a towerlib.TowerModel, or a callable (inputs, ctx) -> loss
        (float scalar, mean over the tower's own examples) or a dict holding
        'loss' and other per-tower tensors.
      inputs: the global batch as a nest of tensors sharing dimension 0
        (split across towers, unevenly when not divisible), or an input
        function input_fn(ctx) returning tower ctx.index's own batch.
      optimizer: a tf.compat.v1.train.Optimizer; it steps once per global batch.
      num_towers, devices, device_type: the towers: a count (default one per
        GPU, else 1), explicit device strings, and 'gpu'/'cpu'/None.
      bn_mode: 'first_tower', 'all_towers' or 'sync' (towerlib.batchnorm).
      update: towerlib.ParameterServer(device=...) (default) or
        towerlib.Replicated(pack_bytes=..., wire_dtype=...), or their names.
      precision: towerlib.Float32() (default), towerlib.BFloat16() or
        towerlib.Float16(loss_scale=...), or their names.
      exchange: towerlib.GraphExchange() or towerlib.CollectiveExchange(
        timeout_seconds=...) for bn_mode='sync' and Replicated; None chooses
        collectives (NCCL) when every tower is a GPU, graph edges otherwise.
      accumulation_steps: k >= 1 micro-batches per tower and optimizer step.
      global_step: a step variable; default get_or_create_global_step().
      ema_decay: keep an ExponentialMovingAverage of the weights (see ema_restore_map).
      learning_rate: a tensor or float, only for the 'learning_rate' summary.
      var_list: the variables to train; default those the towers created.
      summaries: add the losses, learning rate and tower scalars to SUMMARIES.
      check_isolation: refuse a tower whose loss reads another tower's examples.
      workers: a towerlib.exchange.WorkerGroup to train across worker
        processes (docs/distributed.md): this process builds its own towers,
        the exchange spans every worker's, and one step is one update on
        the whole global batch of every worker. Needs update=Replicated().
      clipping: None, or towerlib.ClipByGlobalNorm(clip_norm): the step's
        combined gradient (every tower, micro-batch and worker, unscaled)
        clipped by its global norm, alike on every copy (towerlib.update.clipping).

    Returns:
      A TrainGraph. Its `loss` is the data loss; regularization is in
      `regularization_loss` (towerlib.step.objective).
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "build_train_graph builds a graph, and TensorFlow 2 runs eagerly here. Fix: "
            "build inside `with tf.Graph().as_default():` (or call "
            "tf.compat.v1.disable_eager_execution() first).")
    options = options_lib.resolve_step_options(
        optimizer, tower_fn=tower_fn, **options_lib.STEP_OPTIONS.pick(locals()))
    setting = _step_setting(options, global_step)
    stacks, global_examples = (
        accumulation.tower_stacks(inputs, options.accumulation_steps, setting.devices,
                                  options.bn_mode, setting.host)
        if options.accumulation_steps > 1 else (None, None))
    objective = StepObjective(global_examples, adds_weight_terms=options.workers.is_chief,
                              sum_over_workers=setting.crossing.sums)
    micro_batches = _MicroBatches(
        casting.compute_in(tower_fn, options.precision.compute_dtype), optimizer, setting,
        objective, var_list, check_isolation)
    gradients = _step_gradients(micro_batches, stacks or inputs, setting, optimizer,
                                objective)
    applied = _apply(optimizer, setting, objective, gradients)
    train_op, broadcast_op = setting.crossing.join(applied.train_op, applied.losses,
                                                   setting.variable_update)
    _check_exchanges(setting.reducer)
    scalars = (_add_summaries(gradients.records, objective, applied, learning_rate,
                              setting.loss_scale, setting.host) if summaries else {})
    return TrainGraph(
        train_op=train_op, loss=applied.losses.loss, total_loss=applied.losses.total_loss,
        regularization_loss=applied.losses.regularization_loss,
        tower_losses=[t.loss for t in objective.towers], tower_shares=list(objective.shares),
        tower_outputs=[t.outputs for t in objective.towers], global_step=setting.global_step,
        grads_and_vars=applied.combined.reported, update_ops=applied.update_ops,
        ema=applied.ema or getattr(optimizer, "variable_averages", None),
        devices=setting.devices, contexts=[t.context for t in objective.towers],
        scalars=scalars, numerics_guards=tuple(guards.guards_in(optimizer)),
        variable_update=setting.variable_update.name,
        variable_copies=setting.variable_update.copies,
        sync_copies_op=setting.variable_update.sync_op(), loss_scale=setting.loss_scale,
        broadcast_op=broadcast_op, accumulation_buffers=gradients.buffers,
        gradient_norm=applied.gradient_norm)


@dataclasses.dataclass(frozen=True)
class _StepSetting:
    """What every phase of one build uses."""

    options: options_lib.StepOptions
    devices: List[str]
    host: str
    reducer: Any  # the CrossTowerReducer, None when nothing crosses
    variable_update: Any  # towerlib.update.base.VariableUpdate
    global_step: Any
    loss_scale: Any  # None unless float16 scales the loss
    crossing: Any  # towerlib.step.across_workers: what crosses between workers, if any


def _step_setting(options, global_step):
    devices = list(options.devices)
    devices_lib.warn_missing_gpus(devices)
    cpu_units.warn_if_bfloat16_is_emulated(options.precision, devices)
    host = devices_lib.host_cpu(devices[0])
    workers = options.workers
    towers_in_group = len(devices) * workers.num_workers
    reducer = (options.exchange.reducer(devices, workers)
               if options.exchange is not None and towers_in_group > 1 else None)
    variable_update = options.update.build(len(devices), reducer)
    global_step = _global_step_for(global_step, variable_update.param_device, host)
    with tf.device(host):
        loss_scale = options.precision.make_loss_scale()
    return _StepSetting(options, devices, host, reducer, variable_update, global_step,
                        loss_scale, across_workers.worker_step(workers, reducer,
                                                               options.bn_mode))


class _MicroBatches:
    """Builds the towers, their objectives and gradients on one micro-batch (a call).

    `trained_variables` is the var list the towers train, known after the
    first call (tower 0's variables, or `var_list`).
    """

    def __init__(self, tower_fn, optimizer, setting, objective, var_list, check_isolation):
        self._tower_fn, self._optimizer, self._setting = tower_fn, optimizer, setting
        self._objective, self._var_list = objective, var_list
        self._check_isolation = check_isolation
        self._trainable_before = set(tf.compat.v1.trainable_variables())
        self.trained_variables = None

    def __call__(self, micro_batch_inputs, weight_gate=None):
        setting, objective = self._setting, self._objective
        bn_mode, update = setting.options.bn_mode, setting.variable_update
        regularization_before = objective.regularization_before()
        graph = tf.compat.v1.get_default_graph()
        ops_before = len(graph.get_operations())
        towers, records = towers_lib.build_towers(
            self._tower_fn, micro_batch_inputs, devices=setting.devices, is_training=True,
            bn_mode=bn_mode, param_device=update.param_device,
            records=TowerRecords(len(setting.devices)), cross_tower=setting.reducer,
            check_isolation=self._check_isolation, variable_getter=update.variable_getter)
        _check_built_towers(towers, bn_mode, update, setting.reducer, records)
        compute_dtypes.check_compute_dtype(
            graph.get_operations()[ops_before:], setting.options.precision.compute_dtype,
            towers[0].context.name_scope)
        self.trained_variables = _trained_variables(self._var_list, self._trainable_before)
        activity_before = len(objective.weighted_activity)
        towers, tower_objectives = objective.add_micro_batch(
            towers, regularization_before, weight_gate=weight_gate)
        grads_and_vars = [self._gradients(tower, tower_objective)
                          for tower, tower_objective in zip(towers, tower_objectives)]
        return micro_loop.MicroBatch(
            towers, objective.shares[-len(towers):], grads_and_vars, records,
            objective.weight_terms, objective.weighted_activity[activity_before:],
            apply_step.user_update_ops(towers, bn_mode))

    def _gradients(self, tower, tower_objective):
        setting = self._setting
        with tf.name_scope(tower.context.name_scope), tf.device(tower.context.device):
            if setting.loss_scale is not None:
                tower_objective = setting.loss_scale.scale(tower_objective)
            return _tower_gradients(
                self._optimizer, tower, tower_objective,
                setting.variable_update.tower_variables(self.trained_variables,
                                                        tower.context.index))


@dataclasses.dataclass(frozen=True)
class _StepGradients:
    """Every tower's gradients of the whole step, and what the apply needs with them."""

    records: TowerRecords
    tower_grads_and_vars: list
    var_list: list
    buffers: tuple = ()


def _step_gradients(micro_batches, inputs, setting, optimizer, objective):
    """One micro-batch (`inputs`), or k accumulated in a loop (`inputs` the towers' stacks:
    towerlib.step.micro_loop)."""
    k = setting.options.accumulation_steps
    if k == 1:
        micro = micro_batches(inputs)
        return _StepGradients(micro.records, micro.grads_and_vars,
                              micro_batches.trained_variables)
    totals = micro_loop.accumulate(micro_batches, inputs, k, setting.devices, setting.host)
    objective.use_totals(totals.towers, totals.shares, totals.weight_terms,
                         totals.weighted_activity)
    for guard in guards.guards_in(optimizer):
        guard.check_totals([t.loss for t in totals.towers], totals.grads_and_vars,
                           setting.devices)
    return _StepGradients(totals.records, totals.grads_and_vars,
                          micro_batches.trained_variables, totals.buffers)


@dataclasses.dataclass(frozen=True)
class _Applied:
    train_op: Any
    update_ops: list
    ema: Any
    losses: Any  # towerlib.step.objective.StepLosses
    combined: Any  # towerlib.update.base.CombinedGradients
    gradient_norm: Any = None  # with clipping: the global norm before it


def _apply(optimizer, setting, objective, gradients):
    """The towers' gradients combined (all-reduced, unscaled) and applied once."""
    reducer, options = setting.reducer, setting.options
    _check_exchanges(reducer)  # the backward exchanges
    crossing = setting.crossing
    combined = setting.variable_update.combine(
        gradients.tower_grads_and_vars,
        riders=crossing.riders(objective, gradients.records))
    _check_exchanges(reducer)  # and the gradients' all-reduce
    if setting.loss_scale is not None:
        combined = combined.map_pairs(setting.loss_scale.unscale)
    norm = None
    if options.clipping is not None:
        combined, norm = clipping_lib.clip_combined(combined, options.clipping, setting.host)
    with tf.device(setting.host), tf.name_scope("losses"):
        losses = crossing.losses(objective, combined)
    train_op, update_ops, ema = apply_step.build_apply(
        optimizer, setting.variable_update, combined.apply_pairs, objective.towers,
        gradients.records, options.bn_mode, setting.global_step,
        ema_decay=options.ema_decay, var_list=gradients.var_list,
        loss_scale=setting.loss_scale, losses=crossing.decided_on(losses, objective),
        shared_statistics=crossing.moving_statistics(gradients.records, combined),
        every_sum=[g for g, _ in combined.reported])
    _check_exchanges(reducer)  # an exchange of the moving statistics of their own
    return _Applied(train_op, update_ops, ema, losses, combined, norm)


def _global_step_for(global_step, param_device, host):
    if global_step is not None:
        return global_step
    _check_existing_global_step()
    if callable(param_device):
        with tf.compat.v1.device(param_device):
            return tf.compat.v1.train.get_or_create_global_step()
    with tf.device(host):
        return tf.compat.v1.train.get_or_create_global_step()


def _tower_gradients(optimizer, tower, objective, tower_var_list):
    """The tower's (gradient, variable) pairs, on its device (colocated with the ops)."""
    pairs = optimizer.compute_gradients(objective, var_list=tower_var_list,
                                        colocate_gradients_with_ops=True)
    if all(gradient is None for gradient, _ in pairs):
        names = ", ".join(v.op.name for v in tower_var_list[:5])
        raise ValueError(
            f"Tower {tower.context.index}'s loss {tower.loss.name} does not depend on "
            f"any of its trainable variables ({names}"
            f"{', ...' if len(tower_var_list) > 5 else ''}). Fix: compute the loss "
            "from the model's output (and pass var_list if only some variables train).")
    return pairs


def _check_exchanges(reducer):
    # A tower that made fewer exchanges fails here, at build time, not as an
    # exchange waiting for it at run time.
    if reducer is not None:
        reducer.check_consistent()


def _check_built_towers(towers, bn_mode, variable_update, reducer, records):
    """The build-time checks of one micro-batch's towers, before any gradient."""
    foreign_batch_norm.check_towers(towers, bn_mode)
    variable_update.check_towers(towers)
    _check_exchanges(reducer)
    records.check_batch_norm_in_every_tower()


def _check_existing_global_step():
    """A 'global_step' the user made (the TF 1 tutorial's get_variable) must be an int."""
    existing = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP) or [
        v for v in tf.compat.v1.global_variables() if v.op.name == "global_step"]
    for step in existing[:1]:
        if not step.dtype.base_dtype.is_integer:
            raise TypeError(
                f"The graph's global_step {step.name} is {step.dtype.base_dtype.name}; "
                "a step counter must be an integer. Fix: "
                "tf.compat.v1.train.get_or_create_global_step() (int64), not "
                "get_variable('global_step', ...).")


def _trained_variables(var_list, trainable_before):
    """`var_list`, or the trainable variables the towers created (else all)."""
    if var_list is not None and not list(var_list):
        raise ValueError("var_list is empty: nothing would train. Fix: the variables to "
                         "train, or None for every trainable variable the towers create.")
    if var_list is None:
        trainable = tf.compat.v1.trainable_variables()
        var_list = [v for v in trainable if v not in trainable_before] or trainable
    if not var_list:
        raise ValueError("There are no trainable variables: the tower function "
                         "created none and none existed before.")
    return var_list


def _add_summaries(records, objective, applied, learning_rate, loss_scale, host):
    """The merged tower scalars (by name) and the losses' summaries."""
    losses = applied.losses
    with tf.device(host):
        scalars = summaries_lib.merge_tower_scalars(records, {
            (t.context.micro_batch, t.context.index): share
            for t, share in zip(objective.towers, objective.shares)})
        summaries_lib.scalar_summary("loss", losses.loss)
        summaries_lib.scalar_summary("total_loss", losses.total_loss)
        summaries_lib.scalar_summary("regularization_loss", losses.regularization_loss)
        if learning_rate is not None:
            summaries_lib.scalar_summary("learning_rate", learning_rate)
        if loss_scale is not None:
            summaries_lib.scalar_summary("loss_scale", loss_scale.value)
        if applied.gradient_norm is not None:
            summaries_lib.scalar_summary("gradient_norm", applied.gradient_norm)
    return scalars
