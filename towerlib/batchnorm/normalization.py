"""Batch normalization whose treatment of the towers is chosen by `bn_mode`.

In training a layer normalizes with batch statistics:

- 'first_tower' and 'all_towers': each tower with its own shard's statistics;
- 'sync': every tower with the statistics of the whole global batch.

All modes train through one implementation (`_training_batch_norm`): a
robust two-pass variance, outputs formed from small differences, and the
backward written out. 'sync' adds one cross-tower exchange per layer in
each direction; the modes differ in nothing else, so their costs compare fairly.

The moving statistics used for inference are not updated by each tower.
Every tower records its (count, mean, variance) in the build's
`TowerRecords`; the builder then emits ONE moving-average update per layer
per step (`moving_average_updates`):

- 'first_tower': from tower 0's shard (the classic tutorial heuristic);
- 'all_towers': from the exact pooled statistics of the global batch;
- 'sync': from the global statistics every tower already shares.

Outside a builder (`ctx.records is None`) the update goes into the
UPDATE_OPS collection, as TF 1 code expects.
"""

import dataclasses

import tensorflow as tf

from towerlib.batchnorm import moments
from towerlib.batchnorm import worker_statistics
from towerlib.batchnorm.statistics import BatchNormStatistics


def _training_batch_norm(x, axes, ctx, layer_name, beta, gamma, epsilon, synchronized):
    """Batch norm of x in training, with shard or global-batch statistics.

    synchronized=False (bn_mode 'first_tower' and 'all_towers', or one tower):
    the statistics of this tower's shard, as below with one tower and no
    exchange. synchronized=True ('sync'): those of the whole global batch.

    Each tower summarizes its shard (towerlib.batchnorm.moments.shard_summary:
    a pivot, the mean's offset from it and M2), ONE gather across the towers
    (through ctx.cross_tower, a towerlib.exchange.CrossTowerReducer) hands
    every tower all the summaries, and each tower combines them identically
    with Chan's parallel formula around a common pivot (combine_summaries).
    The variance comes out accurate to ~1e-6 relative however large the mean;
    the output, formed from x - hi, has an error in standard deviations of
    about float32's precision (6e-8) times |hi - mean| / std.

    Exactness. The true counts n_i make unequal shards exact. Statistics and
    normalization are one tf.custom_gradient with the backward written out,
    the one-device batch-norm gradient with global sums:

        dx = k * (g - sum(g) / n - x_hat * sum(g * x_hat) / n)

    where g is this tower's upstream gradient, x_hat = (x - mean) / sqrt(var
    + eps), and the two sums run over the whole global batch: each tower
    sums its shard, and one cross-tower sum adds up the towers' 2C sums. Since
    every tower differentiates its own weighted loss, that is exactly the
    gradient of the global objective. gamma and beta get this tower's own
    sum(g * x_hat) and sum(g), which towerlib adds up over towers as for any
    variable. Writing it out costs far fewer ops than differentiating the
    combination and the normalization op by op.

    Cost: one exchange per layer and direction: forward, a gather of
    num_towers x (3C + 1) floats (one round trip less than all-reducing first
    the sums, then the squared deviations from the resulting mean); backward,
    a sum of 2C floats.

    Args:
      x: the layer input, any float dtype (computed in float32 for half types).
      axes: the reduced axes (all but the channel axis).
      ctx: the TowerContext; ctx.cross_tower is the build's reducer.
      layer_name: the layer's variable-scope name, for errors and op names.
      beta, gamma: the [C] offset and scale variables, or None.
      epsilon: added to the variance.

    Returns:
      y: x normalized, shaped and typed like x.
      count: float32 scalar, the examples x positions the statistics cover:
        the shard's, or the global batch's when synchronized.
      mean, variance: [C], their mean and biased variance.
    """
    reducer = ctx.cross_tower if synchronized else None
    if synchronized and reducer is None:
        raise ValueError(
            f"batch_norm '{layer_name}' runs with bn_mode='sync' in training on "
            f"{ctx.num_towers} towers, but the tower context has no cross-tower "
            "reducer (ctx.cross_tower). Build training graphs with "
            "towerlib.build_train_graph, which creates one; for a forward-only "
            "build_towers(..., is_training=True) pass cross_tower="
            "towerlib.exchange.CrossTowerReducer(devices) and call its "
            "check_consistent() after building.")
    if synchronized and reducer.num_towers != ctx.num_towers:
        raise ValueError(
            f"batch_norm '{layer_name}': the cross-tower reducer spans "
            f"{reducer.num_towers} devices but the build has {ctx.num_towers} "
            "towers; create the reducer from the build's device list.")

    half = x.dtype in (tf.float16, tf.bfloat16)
    stat_dtype = tf.float32 if half else x.dtype
    rank = x.shape.rank
    (channel_axis,) = [a for a in range(rank) if a not in axes]
    channels = int(x.shape[channel_axis])
    broadcast = moments.ChannelBroadcast(rank, channel_axis, channels)

    # The normalization takes the variables' values (read here) as inputs, so
    # its gradient function returns their gradients like any input's.
    # A missing beta / gamma is a constant, whose gradient goes nowhere.
    def value(variable, default):
        if variable is None:
            return tf.fill([channels], tf.constant(default, stat_dtype))
        return tf.cast(tf.convert_to_tensor(variable), stat_dtype)

    gamma, beta = value(gamma, 1.0), value(beta, 0.0)

    with tf.name_scope("sync_batch_norm" if synchronized else "batch_norm"):
        known_count = moments.static_count(x, axes)
        if known_count is None:
            count = tf.cast(_count(x, axes), stat_dtype)
            count_row = tf.reshape(count, [1])
        else:
            count = None  # per_example divides by the Python number
            count_row = tf.constant([float(known_count)], stat_dtype)
        statistics = {}  # total, mean, variance, set by the forward pass

        def global_statistics(summary):
            """One gather of every tower's (count, hi, lo, M2), then combined."""
            rows = reducer.gather_unordered(
                tf.concat([count_row, summary.hi, summary.lo, summary.m2], axis=0),
                ctx.index, name=layer_name)  # [T, 1 + 3C]
            counts, his, los, m2s = tf.split(rows, [1, channels, channels, channels], axis=1)
            return moments.combine_summaries(counts, his, los, m2s, summary.hi)

        def sum_over_towers(per_channel_sums):
            if not synchronized:
                return per_channel_sums
            return reducer.sum(per_channel_sums, ctx.index, name=layer_name,
                               in_gradient=True, differentiable=False)

        @tf.custom_gradient
        def normalize(inputs, scale, offset):
            # Half-precision inputs: statistics in float32. The backward
            # recomputes x - hi from the half input rather than keep a float32
            # copy of the activation alive between forward and backward.
            inputs32 = tf.cast(inputs, tf.float32) if half else inputs
            summary = moments.shard_summary(inputs32, axes, broadcast, count, known_count)
            if synchronized:
                total, mean, variance, mean_minus_hi = global_statistics(summary)
            else:
                total = count_row[0]
                mean = summary.hi + summary.lo
                variance = moments.per_example(summary.m2, count, known_count)
                mean_minus_hi = summary.lo
            statistics.update(total=total, mean=mean, variance=variance)
            y, k, inverse_std = moments.normalize_from_summary(
                summary.deviation, mean_minus_hi, variance, scale, offset, epsilon, broadcast)

            def gradient(grad_y):
                deviation = summary.deviation
                if half:
                    grad_y = tf.cast(grad_y, tf.float32)
                    deviation = tf.cast(inputs, tf.float32) - broadcast(summary.hi)
                sum_g, sum_g_x_hat = moments.local_gradient_sums(
                    grad_y, deviation, inverse_std, mean_minus_hi, axes)
                batch_sums = sum_over_towers(tf.concat([sum_g, sum_g_x_hat], axis=0))
                grad_x = moments.input_gradient(grad_y, deviation, k, inverse_std,
                                                mean_minus_hi, batch_sums, total, broadcast)
                return tf.cast(grad_x, inputs.dtype), sum_g_x_hat, sum_g

            return tf.cast(y, inputs.dtype), gradient

        y = normalize(x, gamma, beta)
    return (y, tf.cast(statistics["total"], tf.float32),
            statistics["mean"], statistics["variance"])


def _count(x, axes):
    """Examples x positions of x at run time, as float32 (int64 on the way)."""
    shape = tf.shape(x, out_type=tf.int64)
    return tf.cast(tf.reduce_prod(tf.gather(shape, axes)), tf.float32)


def _update_moving(variable, value, momentum):
    """variable <- momentum * variable + (1 - momentum) * value."""
    value = tf.cast(value, variable.dtype)
    return variable.assign_sub((variable - value) * (1.0 - momentum))


def batch_norm(x, ctx, *, name, axis=-1, momentum=0.99, epsilon=1e-3,
               center=True, scale=True):
    """Batch normalization over every axis but `axis` (the channels).

    Args:
      x: [N, ..., C] for axis=-1, or e.g. [N, C, H, W] with axis=1.
      ctx: the TowerContext; its is_training and bn_mode decide the statistics.
      name: variable scope of 'beta', 'gamma', 'moving_mean', 'moving_variance'.
      momentum: moving-average decay of the inference statistics.

    Returns:
      A tensor shaped like x.
    """
    rank = x.shape.rank
    if rank is None or rank < 2:
        raise ValueError(f"batch_norm needs an input of known rank >= 2, got {x.shape}.")
    if not -rank <= axis < rank:
        raise ValueError(
            f"batch_norm '{name}': axis {axis} is out of range for an input of rank "
            f"{rank} (shape {x.shape}); use -1 for channels-last or 1 for NCHW.")
    axis = axis % rank
    channels = x.shape[axis]
    if channels is None:
        raise ValueError(f"batch_norm needs a known channel dimension (axis {axis}), "
                         f"got shape {x.shape}.")
    param_shape = [int(channels)]

    with tf.compat.v1.variable_scope(name) as scope:
        beta = gamma = None  # center=False / scale=False: no offset / no scale
        if center:
            beta = tf.compat.v1.get_variable(
                "beta", param_shape, initializer=tf.compat.v1.zeros_initializer())
        if scale:
            gamma = tf.compat.v1.get_variable(
                "gamma", param_shape, initializer=tf.compat.v1.ones_initializer())
        moving_mean = tf.compat.v1.get_variable(
            "moving_mean", param_shape, trainable=False,
            initializer=tf.compat.v1.zeros_initializer())
        moving_variance = tf.compat.v1.get_variable(
            "moving_variance", param_shape, trainable=False,
            initializer=tf.compat.v1.ones_initializer())

        return normalize_with_variables(
            x, ctx, layer_name=scope.name, axis=axis, momentum=momentum, epsilon=epsilon,
            beta=beta, gamma=gamma, moving_mean=moving_mean,
            moving_variance=moving_variance)


def normalize_with_variables(x, ctx, *, layer_name, axis, momentum, epsilon, beta, gamma,
                             moving_mean, moving_variance):
    """`batch_norm` on variables that already exist (a tf_keras layer's, say).

    Args:
      x: the input; `axis` (>= 0) its channel axis.
      ctx: the TowerContext; is_training and bn_mode decide the statistics.
      layer_name: the layer's name without any tower prefix, the same in
        every tower: the key of its statistics in the build's TowerRecords.
      beta, gamma: [C] variables, or None (center=False / scale=False).
      moving_mean, moving_variance: [C] variables, updated as bn_mode says
        (through ctx.records inside a builder, else UPDATE_OPS).

    Returns:
      A tensor shaped like x.
    """
    rank = x.shape.rank
    reduce_axes = [a for a in range(rank) if a != axis]
    if ctx.is_training:
        # Across workers one local tower still has peers (the reducer's group).
        peers = ctx.cross_tower.group_size if ctx.cross_tower is not None else 1
        synchronized = ctx.bn_mode == "sync" and max(ctx.num_towers, peers) > 1
        normalized, count, mean, variance = _training_batch_norm(
            x, reduce_axes, ctx, layer_name, beta, gamma, epsilon, synchronized)
        statistics = BatchNormStatistics(
            tower_index=ctx.index, count=tf.stop_gradient(count),
            mean=tf.stop_gradient(mean), variance=tf.stop_gradient(variance),
            moving_mean=moving_mean, moving_variance=moving_variance,
            momentum=momentum)
        if ctx.records is not None:
            ctx.records.add_batch_norm(layer_name, statistics)
        else:
            for update in _updates_from(statistics):
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
        return normalized

    broadcast_shape = [1] * rank
    broadcast_shape[axis] = int(x.shape[axis])

    def shaped(t):
        # [C] broadcasts against a channels-last input as it is.
        t = tf.cast(t, x.dtype)
        return t if axis == rank - 1 else tf.reshape(t, broadcast_shape)

    return tf.nn.batch_normalization(
        x, shaped(moving_mean), shaped(moving_variance),
        None if beta is None else shaped(beta),
        None if gamma is None else shaped(gamma), epsilon)


def _updates_from(statistics):
    with tf.device(statistics.moving_mean.device):
        return [
            _update_moving(statistics.moving_mean, statistics.mean, statistics.momentum),
            _update_moving(statistics.moving_variance, statistics.variance,
                           statistics.momentum),
        ]


def pooled_statistics(tower_statistics):
    """Exact (count, mean, variance) of the union of several towers' shards.

    Chan's combination: the pooled variance is the count-weighted mean of each
    shard's variance plus the spread of the shard means around the pooled
    mean, so no sum of squares of raw values is ever formed.
    """
    counts = [s.count for s in tower_statistics]
    total = tf.add_n(counts)
    weights = [c / total for c in counts]
    mean = tf.add_n([w * s.mean for w, s in zip(weights, tower_statistics)])
    variance = tf.add_n([
        w * (s.variance + tf.square(s.mean - mean))
        for w, s in zip(weights, tower_statistics)])
    return total, mean, variance


def statistics_across_workers(records, bn_mode, reducer):
    """{layer: per local tower (mean, variance)} every worker shares, or None.

    None unless `reducer` spans several workers. Built apart from the updates
    because it exchanges: it must run on every worker whether or not the step
    is applied (float16 skips the updates of an overflowing step in a tf.cond).
    """
    if reducer is None or not reducer.workers.spans_workers:
        return None
    with tf.name_scope("batch_norm_statistics"):
        return {layer: worker_statistics.statistics_for_copies(
                    layer, layer_statistics, bn_mode, reducer)
                for layer, layer_statistics in records.batch_norm.items()}


def moving_average_updates(records, bn_mode, shared=None):
    """One moving-average update per batch-norm layer, per `bn_mode`.

    Returns a list of ops; run them once per step (the train op does, under
    control dependencies). With replicated variables each tower's copy of the
    moving statistics gets the same update, so the copies stay equal; across
    workers every worker's copies too, from `shared`
    (statistics_across_workers).
    """
    updates = []
    with tf.name_scope("batch_norm_updates"):
        if shared is not None:
            return _updates_across_workers(records, shared)
        for layer_statistics in records.batch_norm.values():
            # 'all_towers' pools every tower's shard; 'first_tower' uses tower
            # 0's shard, 'sync' tower 0's global statistics: with gradient
            # accumulation, pooled over the step's micro-batches.
            used = (layer_statistics if bn_mode == "all_towers" else
                    [s for s in layer_statistics if s.tower_index == 0])
            first = used[0]
            if len(used) > 1:
                with tf.device(first.moving_mean.device):
                    _, mean, variance = pooled_statistics(used)
                first = dataclasses.replace(
                    first, tower_index=-1, count=None, mean=mean, variance=variance)
            # Replicated variables: every tower's copy takes the same change,
            # computed once from tower 0's copy (the copies are equal).
            copies, seen = [], set()
            for copy in [first] + layer_statistics:
                if id(copy.moving_mean) not in seen:
                    seen.add(id(copy.moving_mean))
                    copies.append(copy)
            updates.extend(_same_update_on_every_copy(first, copies))
    return updates


def _same_update_on_every_copy(statistics, copies):
    """copy <- copy - (first - value) * (1 - momentum), for every copy alike.

    One subtraction and one product per statistic serve every tower's copy;
    each copy's assign_sub returns no value (no read op per copy).
    """
    updates = []
    for variable_of, value in ((lambda s: s.moving_mean, statistics.mean),
                               (lambda s: s.moving_variance, statistics.variance)):
        first = variable_of(statistics)
        with tf.device(first.device):
            change = (first - tf.cast(value, first.dtype)) * (1.0 - statistics.momentum)
        for copy in copies:
            with tf.device(variable_of(copy).device):
                updates.append(variable_of(copy).assign_sub(change, read_value=False))
    return updates


def _updates_across_workers(records, shared):
    """Each local copy updated from statistics every worker shares."""
    updates = []
    for layer_name, layer_statistics in records.batch_norm.items():
        for index, (mean, variance) in enumerate(shared[layer_name]):
            copy = next(s for s in layer_statistics if s.tower_index == index)
            updates.extend(_updates_from(dataclasses.replace(
                copy, tower_index=-1, count=None, mean=mean, variance=variance)))
    return updates
