"""Batch norm's moving statistics that are still mostly their initial values.

A moving average updated `updates` times at `momentum` still holds
`momentum ** updates` of its initial value (mean 0, variance 1): at the default
0.99, 57% after 56 steps. An evaluation or an export taken then normalizes with
those values, not the data's, and looks broken (chance-level precision while
the training loss falls) although nothing else is wrong.

    share = moving_statistics.initial_share(0.99, 56)            # 0.57
    line = moving_statistics.fresh_statistics_line({"bn1": 0.99}, 56, "evaluation")
    towerlib.check_moving_statistics(checkpoint, momentum=0.99)  # before an export

The count of updates is the global step: towerlib's batch norm updates its
moving statistics once per step (a float16 step skipped on an overflow updates
neither). Weights warm-started at step 0 from another run's checkpoint are
counted from 0, so their line overstates the share.
"""

import logging
import math

import tensorflow as tf

logger = logging.getLogger("towerlib")

# "Mostly": more than half of each moving average is still its initial value.
MOSTLY_INITIAL = 0.5
# The share a suggested momentum leaves at the step it is suggested for, and the most
# an evaluation early stopping counts may read.
SMALL_SHARE = 0.05
_NAMED_LAYERS = 3


def initial_share(momentum, updates):
    """momentum ** updates: the share of the initial value left after `updates` updates."""
    return float(momentum) ** max(int(updates), 0)


def steps_until_mostly_data(momentum):
    """The first update count at which less than half is the initial value."""
    if momentum <= 0.0:
        return 1
    return max(1, math.floor(math.log(MOSTLY_INITIAL) / math.log(momentum)) + 1)


def suggested_momentum(updates):
    """A momentum leaving at most SMALL_SHARE of the initial value after `updates`,
    rounded down to two decimals (0.9 or lower is what short runs take)."""
    exact = SMALL_SHARE ** (1.0 / max(int(updates), 1))
    return math.floor(exact * 100) / 100


def layer_momenta(train_graph):
    """{layer: momentum} of the batch-norm layers whose moving statistics the step updates.

    Read from the build's records (towerlib.batch_norm, for_tower(ctx)'s
    batch_normalization, tf_keras BatchNormalization in a KerasTower). A layer
    whose momentum is not a constant, and batch norm towerlib does not route,
    are left out.
    """
    found = {}
    for ctx in train_graph.contexts:
        records = getattr(ctx, "records", None)
        if records is None:
            continue
        for layer, statistics in records.batch_norm.items():
            for entry in statistics:
                momentum = _constant_momentum(entry.momentum)
                if momentum is not None:
                    found.setdefault(layer, momentum)
    return found


def _constant_momentum(momentum):
    """A float momentum, or the training branch's constant of a training switch."""
    if isinstance(momentum, (int, float)):
        return float(momentum)
    value = tf.get_static_value(momentum)
    if value is not None:
        return float(value)
    # A `training` tensor gives where(training, momentum, 1.0) (1: no update).
    operation = getattr(momentum, "op", None)
    if operation is not None and operation.type in ("Select", "SelectV2"):
        value = tf.get_static_value(operation.inputs[1])
        if value is not None:
            return float(value)
    return None


def fresh_layers(momenta, updates):
    """{layer: share} of the layers still more than MOSTLY_INITIAL initial, largest first."""
    shares = {layer: initial_share(m, updates) for layer, m in momenta.items()}
    fresh = {layer: s for layer, s in shares.items() if s > MOSTLY_INITIAL}
    return dict(sorted(fresh.items(), key=lambda item: -item[1]))


def largest_share(momenta, updates):
    """The largest initial share over the layers after `updates` updates (0 when none).

    Early stopping counts an evaluation only when it is at most SMALL_SHARE, the
    rule of docs/large_batches.md for an evaluation one can trust.
    """
    return max((initial_share(m, updates) for m in momenta.values()), default=0.0)


def fresh_statistics_line(momenta, updates, what):
    """One line naming the share, the layers and the fix; None when none is fresh.

    Args:
      momenta: {layer: momentum}.
      updates: the moving averages' update count (the global step).
      what: what is taken, e.g. 'evaluation at step 56', 'export of step 56'.
    """
    fresh = fresh_layers(momenta, updates)
    if not fresh:
        return None
    layer, share = next(iter(fresh.items()))
    momentum = momenta[layer]
    names = list(fresh)[:_NAMED_LAYERS]
    more = len(fresh) - len(names)
    layers = ", ".join(names) + (f" and {more} more" if more else "")
    return (f"The {what} uses batch-norm moving statistics that are still "
            f"{share:.0%} their initial values (momentum {momentum:g} after {updates} "
            f"updates: {momentum:g}^{updates} = {share:.2f}; layers {layers}). Fix: a "
            f"lower batch-norm momentum, e.g. {suggested_momentum(updates):g} "
            f"({initial_share(suggested_momentum(updates), updates):.0%} initial at this "
            f"step), or evaluate and export from step "
            f"{steps_until_mostly_data(momentum)} on.")


def checkpoint_layers(checkpoint):
    """The batch-norm layers of a checkpoint: the scopes of its 'moving_mean' variables."""
    names = [name for name, _ in tf.train.list_variables(checkpoint)]
    return sorted(name[:-len("/moving_mean")] for name in names
                  if name.endswith("/moving_mean"))


def check_moving_statistics(checkpoint, momentum, *, what="export"):
    """Logs one warning line when `checkpoint`'s moving statistics are mostly initial.

    Call it before exporting (or evaluating) a checkpoint: the model it gives
    normalizes with these statistics. The update count is the checkpoint's
    global step.

    Args:
      checkpoint: a checkpoint prefix holding 'global_step'.
      momentum: the batch-norm momentum the run trained with: a float for
        every layer, or {layer scope: momentum}.
      what: the word for what is taken ('export', 'evaluation').

    Returns:
      The line logged, or None when no layer is mostly its initial values
      (or the checkpoint has no batch norm).
    """
    given = momentum.values() if isinstance(momentum, dict) else [momentum]
    if not all(isinstance(m, (int, float)) and not isinstance(m, bool) and 0 <= m < 1
               for m in given):
        raise ValueError(f"check_moving_statistics: momentum={momentum!r}: give the "
                         "batch-norm momentum in [0, 1) (or {layer: momentum}).")
    step = int(tf.train.load_variable(checkpoint, "global_step"))
    layers = checkpoint_layers(checkpoint)
    if isinstance(momentum, dict):
        momenta = {layer: float(momentum[layer]) for layer in layers if layer in momentum}
    else:
        momenta = {layer: float(momentum) for layer in layers}
    line = fresh_statistics_line(momenta, step, f"{what} of step {step}")
    if line is not None:
        logger.warning("%s", line)
    return line
