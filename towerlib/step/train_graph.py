"""Assembling the training step: towers, weighted losses, one update.

One step consumes one global batch of B examples split over N towers:

    objective = sum_i (n_i / B) * loss_i + regularization
              = mean loss over all B examples + regularization

where loss_i is tower i's mean over its n_i examples. Each tower
differentiates its own weighted term on its own device; the gradients are
summed per variable on the variable's device; one `apply_gradients` adds 1 to
`global_step`. Regularization is added to tower 0's term only, so it counts
once (a weight's REGULARIZATION_LOSSES term, or weight decay the tower put
into the 'losses' collection and returned inside its loss: towerlib.step.loss_terms).
The chosen batch-norm updates run under control dependencies of the update
(seed 000); the weights' moving average, when asked for, after it.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from towerlib.step import accumulation
from towerlib.step import apply as apply_step
from towerlib import exchange
from towerlib.batchnorm import foreign as foreign_batch_norm
from towerlib.run import guards
from towerlib.precision import loss_scaling
from towerlib.step import loss_terms
from towerlib.precision import casting as mixed_precision
from towerlib.step import devices as devices_lib
from towerlib.step import summaries as summaries_lib
from towerlib.step import towers as towers_lib
from towerlib.update import variable_update as variable_update_lib
from towerlib.step.context import TowerContext, TowerRecords, check_bn_mode


@dataclasses.dataclass
class TrainGraph:
    """The training step's tensors and ops.

    Attributes:
      train_op: run once per global batch.
      loss: float32 scalar, mean loss over the global batch (no regularization).
      total_loss: loss + regularization_loss, the optimized objective.
      regularization_loss: float32 scalar (0 when there is none).
      tower_losses: each tower's mean loss over its own shard.
      tower_shares: float32 scalars n_i / B.
      tower_outputs: per tower, the non-loss entries of a dict result.
      global_step: the step counter variable.
      grads_and_vars: the aggregated (gradient, variable) pairs applied.
      update_ops: batch-norm and other update ops the train op waits for.
      ema: the weights' ExponentialMovingAverage, or None.
      devices: the tower device strings.
      contexts: each tower's TowerContext.
      scalars: the merged tower scalars, by name.
      numerics_guards: the towerlib.guard_numerics wrappers whose update this
        graph applies (run_training names their failures), usually () or one.
      variable_update: 'parameter_server' or 'replicated'.
      variable_copies: with 'replicated', {tower 0's variable name: every
        tower's copy, in tower order} for the weights, moving statistics and
        optimizer slots; {} otherwise.
      sync_copies_op: with 'replicated', an op copying tower 0's values into
        the other towers' copies: run it after restoring tower 0's variables
        in a plain Session (run_training needs none); else None.
      loss_scale: the towerlib.precision.loss_scaling.LossScale of a float16 build
        (run_training adds its floor hook), else None.
    """

    train_op: tf.Operation
    loss: tf.Tensor
    total_loss: tf.Tensor
    regularization_loss: tf.Tensor
    tower_losses: List[tf.Tensor]
    tower_shares: List[tf.Tensor]
    tower_outputs: List[Dict[str, Any]]
    global_step: Any
    grads_and_vars: list
    update_ops: List[Any]
    ema: Optional[tf.compat.v1.train.ExponentialMovingAverage]
    devices: List[str]
    contexts: List[TowerContext]
    scalars: Dict[str, tf.Tensor]
    numerics_guards: Tuple[Any, ...] = ()
    variable_update: str = "parameter_server"
    variable_copies: Dict[str, List[Any]] = dataclasses.field(default_factory=dict)
    sync_copies_op: Any = None
    loss_scale: Any = None


def _check_optimizer(optimizer):
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            f"optimizer must be a tf.compat.v1.train.Optimizer (e.g. "
            f"tf.compat.v1.train.MomentumOptimizer), got {type(optimizer).__name__}. "
            "Keras optimizers do not run in graph-mode towers.")


def check_ema_decay(ema_decay):
    """Refuses a decay outside (0, 1); None means no moving average."""
    if ema_decay is not None and not 0.0 < ema_decay < 1.0:
        raise ValueError(f"ema_decay must be in (0, 1) or None, got {ema_decay}.")


def _check_sync_transport(sync_transport):
    # Checked whatever the mode and tower count, so a typo shows at once and
    # not on the day the same code first runs bn_mode='sync' on two towers.
    if sync_transport is not None and sync_transport not in exchange.TRANSPORTS:
        raise ValueError(
            f"sync_transport must be one of {exchange.TRANSPORTS}, or None to "
            f"choose by device type, got {sync_transport!r}.")


def _global_step_for(global_step, param_device, devices):
    if global_step is not None:
        return global_step
    if callable(param_device):
        with tf.compat.v1.device(param_device):
            return tf.compat.v1.train.get_or_create_global_step()
    with tf.device(devices_lib.host_cpu(devices[0])):
        return tf.compat.v1.train.get_or_create_global_step()


def _make_cross_tower_reducer(bn_mode, variable_update, devices, timeout_seconds,
                              transport):
    """The exchange of sync batch norm's statistics and replicated gradients, or None."""
    if (bn_mode != "sync" and variable_update != "replicated") or len(devices) == 1:
        return None
    return exchange.CrossTowerReducer(
        devices, timeout_seconds=timeout_seconds, transport=transport)


def _check_loss_scale(compute_dtype, loss_scale, optimizer):
    if loss_scale is not None and compute_dtype != tf.float16:
        raise ValueError(
            f"loss_scale={loss_scale!r} with compute_dtype='{compute_dtype.name}': only "
            "float16 needs loss scaling (its gradients underflow); bfloat16 has "
            "float32's range. Drop loss_scale, or use compute_dtype='float16'.")
    if compute_dtype != tf.float16:
        return
    for guard in guards.guards_in(optimizer):
        if guard.check_gradients:
            raise ValueError(
                "guard_numerics(check_gradients=True) with compute_dtype='float16': "
                "under loss scaling an overflowing gradient is expected (the step is "
                "skipped and the scale lowered), not an error. Use "
                "guard_numerics(optimizer), which still stops on a non-finite loss.")
    if isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
        raise ValueError(
            "compute_dtype='float16' with SyncReplicasOptimizer: a replica that skips an "
            "overflowing step sends no gradients and the others would wait for it. "
            "Use compute_dtype='bfloat16' (no loss scaling) across machines.")


def _tower_shares(towers):
    counts = [tf.cast(t.context.batch_size, tf.float32) for t in towers]
    with tf.name_scope("tower_shares"):
        total = tf.add_n(counts)
        return [count / total for count in counts]


def _new_regularization_losses(before):
    after = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
    seen = {id(t) for t in before}
    return [t for t in after if id(t) not in seen]


def _split_regularization(terms, towers):
    """(shared terms, per-tower terms) of the build's regularization losses.

    A weight's regularizer is created once, with the variable, outside any
    tower's name scope: it counts once. A term the tower function adds itself
    (an activity regularizer on its activations) exists once per tower, in
    the tower's name scope: it is part of that tower's loss and is weighted
    by the tower's share like the loss, so its strength does not grow with
    the tower count.
    """
    tower_terms = [[t for t in terms if t.name.startswith(tower.context.name_scope)]
                   for tower in towers]
    in_towers = {id(t) for own in tower_terms for t in own}
    return [t for t in terms if id(t) not in in_towers], tower_terms


def build_train_graph(tower_fn, inputs, optimizer, *, num_towers=None,
                      devices=None, device_type=None, bn_mode="first_tower", param_device=None,
                      variable_update="parameter_server", accumulation_steps=1,
                      compute_dtype="float32", loss_scale=None,
                      allreduce_in_compute_dtype=False,
                      gradient_pack_bytes=variable_update_lib.DEFAULT_GRADIENT_PACK_BYTES,
                      global_step=None, ema_decay=None, learning_rate=None,
                      var_list=None, summaries=True,
                      sync_timeout_seconds=None, sync_transport=None,
                      check_isolation=True):
    """Builds the multi-tower training step.

    Args:
      tower_fn: a towerlib.TowerModel, or a callable (inputs, ctx) -> loss
        (float scalar, mean over the tower's own examples) or a dict holding
        'loss' and other per-tower tensors.
      inputs: the global batch as a nest of tensors sharing dimension 0
        (split across towers, unevenly when not divisible), or an input
        function input_fn(ctx) returning tower ctx.index's own batch.
      optimizer: a tf.compat.v1.train.Optimizer; it steps once per global batch.
      num_towers: number of towers (default: one per GPU, else 1).
      devices: explicit tower device strings instead of num_towers.
      device_type: 'gpu', 'cpu' or None (GPUs when the machine has them).
      bn_mode: 'first_tower', 'all_towers' or 'sync' (see towerlib.batchnorm.normalization).
      param_device: with 'parameter_server': 'cpu' (variables on the host
        CPU, the default), 'gpu' (spread over the tower GPUs by byte size) or a
        device function. Not with 'replicated'.
      variable_update: 'parameter_server' (one copy of every variable) or
        'replicated' (a copy per tower on its device, gradients all-reduced;
        see towerlib.update.variable_update).
      gradient_pack_bytes: with 'replicated', dense gradients are packed into
        all-reduce buffers of at most this many bytes (0: one per gradient).
      accumulation_steps: k >= 1; one optimizer step consumes k micro-batches
        per tower, the global batch split k ways then over the towers, the
        gradients summed in float32 (see towerlib.step.accumulation).
      compute_dtype: 'float32', 'float16' or 'bfloat16': the towers compute
        in it (floating inputs cast to it, trainable variables stored in
        float32 and read cast to it); the loss, batch-norm statistics and
        gradients stay float32 (see towerlib.precision.casting).
      loss_scale: with 'float16': None or 'dynamic' (the default: dynamic
        loss scaling, towerlib.precision.loss_scaling), a number (a fixed scale) or a
        towerlib.precision.loss_scaling.LossScale. Refused with the other dtypes, which
        need none.
      allreduce_in_compute_dtype: with 'replicated' and a half compute dtype,
        all-reduce the gradients in it (half the bytes on the wire, sums
        rounded to it) instead of float32; they reach the float32 variables
        in float32 either way.
      global_step: a step variable; default get_or_create_global_step().
      ema_decay: if set, keep an ExponentialMovingAverage of the trainable
        weights, updated after each step (evaluate with `ema_restore_map`).
      learning_rate: a tensor or float, only for the 'learning_rate' summary.
      var_list: variables to train; default the trainable variables the towers
        created (all trainable variables when they created none).
      summaries: add 'loss', 'total_loss', 'regularization_loss',
        'learning_rate' and the merged tower scalars to the SUMMARIES collection.
      sync_timeout_seconds: with bn_mode='sync' through collectives, an
        optional per-op timeout of the cross-tower collectives (None: none;
        costly, see towerlib.exchange.CrossTowerReducer). Towers that would make
        different collectives fail at build time; bound runs with
        towerlib.exchange.bounded_session_config and check_fetches.
      sync_transport: how the towers exchange sync batch norm's statistics
        and replicated gradients: 'graph', 'collective', or None for
        'collective' (NCCL) when every tower is a GPU and 'graph' otherwise
        (see towerlib.exchange.CrossTowerReducer).
      check_isolation: refuse a tower whose loss reads another tower's
        examples (see towerlib.checks.tower_isolation); False only for a deliberate
        cross-tower dependency outside towerlib.exchange.

    Returns:
      A TrainGraph. Its `loss` is the data loss: regularization the towers
      return inside their loss (GraphKeys.REGULARIZATION_LOSSES terms, or
      weight decay in the 'losses' collection, the TF 1 tutorial's way) is
      reported in `regularization_loss` instead (see towerlib.step.loss_terms).
    """
    check_bn_mode(bn_mode)
    _check_sync_transport(sync_transport)
    _check_optimizer(optimizer)
    check_ema_decay(ema_decay)
    devices = towers_lib.resolve_devices(num_towers, devices, device_type)
    compute_dtype = mixed_precision.check_compute_dtype(compute_dtype)
    if allreduce_in_compute_dtype and (variable_update != "replicated"
                                       or compute_dtype == tf.float32):
        raise ValueError("allreduce_in_compute_dtype=True concerns the all-reduce of "
                         "variable_update='replicated' in a half compute_dtype; set "
                         "both, or drop it.")
    cross_tower = _make_cross_tower_reducer(
        bn_mode, variable_update, devices, sync_timeout_seconds, sync_transport)
    update = variable_update_lib.make_variable_update(
        variable_update, len(devices), param_device, cross_tower, gradient_pack_bytes,
        wire_dtype=(compute_dtype if allreduce_in_compute_dtype
                    and compute_dtype != tf.float32 else None))
    global_step = _global_step_for(global_step, update.param_device, devices)

    accumulation_steps = accumulation.check_accumulation_steps(accumulation_steps)
    _check_loss_scale(compute_dtype, loss_scale, optimizer)
    host = devices_lib.host_cpu(devices[0])
    if compute_dtype == tf.float16:
        with tf.device(host):
            loss_scale = loss_scaling.make_loss_scale(
                "dynamic" if loss_scale is None else loss_scale)
    tower_fn = mixed_precision.compute_in(tower_fn, compute_dtype)
    micro_inputs, global_examples = accumulation.micro_batches(
        inputs, accumulation_steps, devices, bn_mode, host)

    records = TowerRecords(len(devices))
    trainable_before = set(tf.compat.v1.trainable_variables())
    towers, shares, tower_grads_and_vars = [], [], []
    shared_terms, weighted_tower_regularization = [], []
    for micro_batch, micro_batch_inputs in enumerate(micro_inputs):
        regularization_before = tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
        previous_gradients = [g for pairs in tower_grads_and_vars for g, _ in pairs
                              if g is not None]
        with accumulation.micro_batch_scope(micro_batch, accumulation_steps):
            built, records = towers_lib.build_towers(
                tower_fn, accumulation.after(micro_batch_inputs, previous_gradients, host),
                devices=devices, is_training=True, bn_mode=bn_mode,
                param_device=update.param_device, records=records,
                cross_tower=cross_tower, check_isolation=check_isolation,
                variable_getter=update.variable_getter,
                reuse_variables=micro_batch > 0, micro_batch=micro_batch)
        foreign_batch_norm.check_towers(built, bn_mode)  # before any gradient is built
        update.check_towers(built)
        if cross_tower is not None:
            # A tower that made fewer synchronized calls fails here, at build
            # time, not as an exchange waiting for it at run time.
            cross_tower.check_consistent()
        records.check_batch_norm_in_every_tower()

        if var_list is None:
            trainable = tf.compat.v1.trainable_variables()
            var_list = [v for v in trainable if v not in trainable_before] or trainable
        if not var_list:
            raise ValueError("There are no trainable variables: the tower function "
                             "created none and none existed before.")

        built_shares = (_tower_shares(built) if global_examples is None else
                        [tf.cast(t.context.batch_size, tf.float32) / global_examples
                         for t in built])
        new_regularization = _new_regularization_losses(regularization_before)
        built_shared_terms, tower_terms = _split_regularization(new_regularization, built)
        # The TF 1 tutorial's tower loss, add_n of its scoped 'losses' collection,
        # holds the weight decay: keep it out of `loss` and count it once.
        if micro_batch == 0:  # weights' terms are created once, with the weights
            first_regularization = new_regularization
        built, collection_terms = loss_terms.separate_regularization(
            built, (first_regularization + new_regularization) if micro_batch
            else new_regularization)
        if micro_batch == 0:  # weights' terms exist once, from the first build
            shared_terms = built_shared_terms + collection_terms

        for tower, share, own_terms in zip(built, built_shares, tower_terms):
            with tf.name_scope(tower.context.name_scope), tf.device(tower.context.device):
                objective = share * tower.loss
                if own_terms:
                    weighted_tower_regularization.append(share * tf.add_n(own_terms))
                    objective += weighted_tower_regularization[-1]
                if tower.context.is_first and micro_batch == 0 and shared_terms:
                    objective += tf.add_n(shared_terms, name="regularization")
                if loss_scale is not None:
                    objective = loss_scale.scale(objective)
                tower_grads_and_vars.append(optimizer.compute_gradients(
                    objective,
                    var_list=update.tower_variables(var_list, tower.context.index),
                    colocate_gradients_with_ops=True))
        towers.extend(built)
        shares.extend(built_shares)

    if cross_tower is not None:
        cross_tower.check_consistent()  # the backward exchanges, too
    pairs, grads_and_vars = update.combine(tower_grads_and_vars)
    if cross_tower is not None:
        cross_tower.check_consistent()  # and the gradients' all-reduce
    if loss_scale is not None:
        pairs = loss_scale.unscale(pairs)
        grads_and_vars = pairs[:len(grads_and_vars)]  # tower 0's come first

    with tf.device(host), tf.name_scope("losses"):
        loss = tf.add_n([s * t.loss for s, t in zip(shares, towers)], name="loss")
        tower_losses, tower_shares, tower_outputs, contexts = accumulation.per_tower(
            towers, shares, len(devices))
    train_op, update_ops, ema = apply_step.build_apply(
        optimizer, update, pairs, towers, records, bn_mode, global_step,
        ema_decay=ema_decay, var_list=var_list, loss_scale=loss_scale,
        losses=[t.loss for t in towers])

    with tf.device(host), tf.name_scope("losses"):
        all_terms = shared_terms + weighted_tower_regularization
        regularization_loss = (
            tf.add_n(all_terms, name="regularization_loss")
            if all_terms else tf.constant(0.0, name="regularization_loss"))
        total_loss = tf.add(loss, regularization_loss, name="total_loss")

    scalars = {}
    if summaries:
        with tf.device(host):
            scalars = summaries_lib.merge_tower_scalars(records, {
                (t.context.micro_batch, t.context.index): share
                for t, share in zip(towers, shares)})
            summaries_lib.scalar_summary("loss", loss)
            summaries_lib.scalar_summary("total_loss", total_loss)
            summaries_lib.scalar_summary("regularization_loss", regularization_loss)
            if learning_rate is not None:
                summaries_lib.scalar_summary("learning_rate", learning_rate)

    return TrainGraph(
        train_op=train_op, loss=loss, total_loss=total_loss,
        regularization_loss=regularization_loss,
        tower_losses=tower_losses, tower_shares=tower_shares,
        tower_outputs=tower_outputs, global_step=global_step,
        grads_and_vars=grads_and_vars, update_ops=update_ops, ema=ema,
        devices=devices, contexts=contexts, scalars=scalars,
        numerics_guards=tuple(guards.guards_in(optimizer)),
        variable_update=update.name, variable_copies=update.copies,
        sync_copies_op=update.sync_op(), loss_scale=loss_scale)


def ema_restore_map(ema_decay, var_list=None):
    """A Saver var_list that loads the EMA weights into the model's variables.

    Non-trainable variables (batch-norm moving statistics, global_step)
    restore as themselves.
    """
    check_ema_decay(ema_decay)
    ema = tf.compat.v1.train.ExponentialMovingAverage(ema_decay)
    if var_list is None:
        var_list = tf.compat.v1.trainable_variables()
    return ema.variables_to_restore(moving_avg_variables=var_list)
