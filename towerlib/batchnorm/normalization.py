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

from towerlib.batchnorm import moments, worker_statistics
from towerlib.batchnorm.statistics import BatchNormStatistics, moving_variance_input


def _training_batch_norm(x, axes, ctx, layer_name, beta, gamma, epsilon, synchronized):
    """Batch norm of x in training, with this shard's or the global batch's statistics.

    synchronized=False ('first_tower', 'all_towers', or one tower): the shard's.
    True ('sync'): the whole global batch's, from ONE gather of every tower's
    shard summary combined with Chan's formula, and the batch-norm backward
    written out over global sums (one cross-tower sum of 2C floats): N towers
    take one device's step. The derivation and its precision are in
    docs/batch_norm_modes.md, "How sync works".

    Args:
      x: the layer input, any float dtype (statistics in float32 for half types).
      axes: the reduced axes (all but the channel axis).
      ctx: the TowerContext; ctx.cross_tower is the build's reducer.
      layer_name: the layer's name, for errors and op names.
      beta, gamma: the [C] offset and scale variables, or None.
      epsilon: added to the variance.

    Returns:
      (y shaped and typed like x, count: float32 scalar of the examples x
      positions covered, mean [C], biased variance [C]).
    """
    reducer = _reducer_for(ctx, layer_name) if synchronized else None
    kernel = _Kernel(x, axes, ctx.index, layer_name, reducer, epsilon)
    scale, offset = kernel.parameter(gamma, 1.0), kernel.parameter(beta, 0.0)
    with tf.name_scope("sync_batch_norm" if synchronized else "batch_norm"):
        kernel.count_inputs(x)
        y = kernel.normalize(x, scale, offset)
    return y, tf.cast(kernel.total, tf.float32), kernel.mean, kernel.variance


def _reducer_for(ctx, layer_name):
    """The build's cross-tower reducer for a 'sync' layer, checked against the towers."""
    reducer = ctx.cross_tower
    if reducer is None:
        raise ValueError(
            f"batch_norm '{layer_name}' runs with bn_mode='sync' in training on "
            f"{ctx.num_towers} towers, but the tower context has no cross-tower "
            "reducer (ctx.cross_tower). Build training graphs with "
            "towerlib.build_train_graph, which creates one; for a forward-only "
            "build_towers(..., is_training=True) pass cross_tower="
            "towerlib.exchange.CrossTowerReducer(devices) and call its "
            "check_consistent() after building.")
    if reducer.num_towers != ctx.num_towers:
        raise ValueError(
            f"batch_norm '{layer_name}': the cross-tower reducer spans "
            f"{reducer.num_towers} devices but the build has {ctx.num_towers} "
            "towers; create the reducer from the build's device list.")
    return reducer


class _Kernel:
    """One layer's training normalization in one tower: forward and written-out backward.

    `normalize` is a tf.custom_gradient; its forward leaves the statistics it
    used in `total`, `mean` and `variance` (the builder's moving-average
    update reads them). With a reducer the statistics are the global batch's.
    """

    def __init__(self, x, axes, tower_index, layer_name, reducer, epsilon):
        self.axes, self.tower_index, self.layer_name = axes, tower_index, layer_name
        self.reducer, self.epsilon = reducer, epsilon
        self.half = x.dtype in (tf.float16, tf.bfloat16)
        self.dtype = tf.float32 if self.half else x.dtype
        rank = x.shape.rank
        (channel_axis,) = [a for a in range(rank) if a not in axes]
        self.channels = int(x.shape[channel_axis])
        self.broadcast = moments.ChannelBroadcast(rank, channel_axis, self.channels)
        self.normalize = tf.custom_gradient(self._forward)
        self.total = self.mean = self.variance = None

    def parameter(self, variable, default):
        """gamma / beta's value as an input of the normalization (its gradient is returned
        like any input's); a constant `default` for a missing one."""
        if variable is None:
            return tf.fill([self.channels], tf.constant(default, self.dtype))
        return tf.cast(tf.convert_to_tensor(variable), self.dtype)

    def count_inputs(self, x):
        """The shard's count: a Python number when known while building, else a tensor."""
        self.known_count = moments.static_count(x, self.axes)
        if self.known_count is None:
            self.count = tf.cast(_count(x, self.axes), self.dtype)
            self.count_row = tf.reshape(self.count, [1])
        else:
            self.count = None  # per_example divides by the Python number
            self.count_row = tf.constant([float(self.known_count)], self.dtype)

    def _forward(self, inputs, scale, offset):
        # Half-precision inputs: statistics in float32. The backward recomputes
        # x - hi from the half input rather than keep a float32 copy alive.
        inputs32 = tf.cast(inputs, tf.float32) if self.half else inputs
        summary = moments.shard_summary(inputs32, self.axes, self.broadcast, self.count,
                                        self.known_count)
        if self.reducer is not None:
            total, mean, variance, mean_minus_hi = self._global_statistics(summary)
        else:
            total, mean, mean_minus_hi = self.count_row[0], summary.hi + summary.lo, summary.lo
            variance = moments.per_example(summary.m2, self.count, self.known_count)
        self.total, self.mean, self.variance = total, mean, variance
        y, k, inverse_std = moments.normalize_from_summary(
            summary.deviation, mean_minus_hi, variance, scale, offset, self.epsilon,
            self.broadcast)

        def gradient(grad_y):
            deviation = summary.deviation
            if self.half:
                grad_y = tf.cast(grad_y, tf.float32)
                deviation = tf.cast(inputs, tf.float32) - self.broadcast(summary.hi)
            sum_g, sum_g_x_hat = moments.local_gradient_sums(
                grad_y, deviation, inverse_std, mean_minus_hi, self.axes)
            batch_sums = self._sum_over_towers(tf.concat([sum_g, sum_g_x_hat], axis=0))
            grad_x = moments.input_gradient(grad_y, deviation, k, inverse_std,
                                            mean_minus_hi, batch_sums, total, self.broadcast)
            return tf.cast(grad_x, inputs.dtype), sum_g_x_hat, sum_g

        return tf.cast(y, inputs.dtype), gradient

    def _global_statistics(self, summary):
        """One gather of every tower's (count, hi, lo, M2), then combined identically."""
        rows = self.reducer.gather_unordered(
            tf.concat([self.count_row, summary.hi, summary.lo, summary.m2], axis=0),
            self.tower_index, name=self.layer_name)  # [T, 1 + 3C]
        c = self.channels
        counts, his, los, m2s = tf.split(rows, [1, c, c, c], axis=1)
        return moments.combine_summaries(counts, his, los, m2s, summary.hi)

    def _sum_over_towers(self, per_channel_sums):
        if self.reducer is None:
            return per_channel_sums
        return self.reducer.sum(per_channel_sums, self.tower_index, name=self.layer_name,
                                in_gradient=True, differentiable=False)


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
    if not (hasattr(ctx, "is_training") and hasattr(ctx, "bn_mode")):
        raise TypeError(
            f"batch_norm '{name}': its second argument is the tower's context (the "
            f"tower function's `ctx`), got {type(ctx).__name__}. Fix: "
            "towerlib.batch_norm(x, ctx, name=...).")
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
                             moving_mean, moving_variance, unbiased_moving_variance=False):
    """`batch_norm` on variables that already exist (a tf_keras layer's, say).

    Args:
      x: the input; `axis` (>= 0) its channel axis.
      ctx: the TowerContext; is_training and bn_mode decide the statistics.
      layer_name: the layer's name without any tower prefix, the same in
        every tower: the key of its statistics in the build's TowerRecords.
      beta, gamma: [C] variables, or None (center=False / scale=False).
      moving_mean, moving_variance: [C] variables, updated as bn_mode says
        (through ctx.records inside a builder, else UPDATE_OPS).
      unbiased_moving_variance: the moving variance averages the Bessel-corrected
        variance of the batch the mode normalizes (tf_keras' fused kernel).

    Returns:
      A tensor shaped like x.
    """
    rank = x.shape.rank
    reduce_axes = [a for a in range(rank) if a != axis]
    if ctx.is_training:
        # Across workers one local tower still has peers (the reducer's group).
        peers = ctx.cross_tower.group_size if ctx.cross_tower is not None else 1
        synchronized = ctx.bn_mode.exchanges(ctx.num_towers, peers)
        normalized, count, mean, variance = _training_batch_norm(
            x, reduce_axes, ctx, layer_name, beta, gamma, epsilon, synchronized)
        statistics = BatchNormStatistics(
            tower_index=ctx.index, count=tf.stop_gradient(count),
            mean=tf.stop_gradient(mean), variance=tf.stop_gradient(variance),
            moving_mean=moving_mean, moving_variance=moving_variance,
            momentum=momentum, unbiased=unbiased_moving_variance)
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
        variance = moving_variance_input(statistics.variance, statistics.count,
                                         statistics.unbiased)
        return [
            _update_moving(statistics.moving_mean, statistics.mean, statistics.momentum),
            _update_moving(statistics.moving_variance, variance, statistics.momentum),
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
        if not records.batch_norm:
            return {}
        return worker_statistics.statistics_for_layers(records.batch_norm, bn_mode, reducer)


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
            used = bn_mode.moving_statistics(layer_statistics)
            first = used[0]
            if len(used) > 1:
                with tf.device(first.moving_mean.device):
                    total, mean, variance = pooled_statistics(used)
                first = dataclasses.replace(
                    first, tower_index=-1, count=total, mean=mean, variance=variance)
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
    with tf.device(statistics.moving_mean.device):
        variance = moving_variance_input(statistics.variance, statistics.count,
                                         statistics.unbiased)
    for variable_of, value in ((lambda s: s.moving_mean, statistics.mean),
                               (lambda s: s.moving_variance, variance)):
        first = variable_of(statistics)
        with tf.device(first.device):
            change = (first - tf.cast(value, first.dtype)) * (1.0 - statistics.momentum)
        for copy in copies:
            with tf.device(variable_of(copy).device):
                updates.append(variable_of(copy).assign_sub(change, read_value=False))
    return updates


def _updates_across_workers(records, shared):
    """Each local copy updated from statistics every worker shares (a moving variance's
    Bessel correction, if any, already made: worker_statistics)."""
    updates = []
    for layer_name, layer_statistics in records.batch_norm.items():
        for index, (mean, variance) in enumerate(shared[layer_name]):
            copy = next(s for s in layer_statistics if s.tower_index == index)
            updates.extend(_updates_from(dataclasses.replace(
                copy, tower_index=-1, count=None, mean=mean, variance=variance,
                unbiased=False)))
    return updates
