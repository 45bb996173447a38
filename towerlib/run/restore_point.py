"""Where the chief's run starts: the checkpoint it restores, checked before any session.

    restore_from, partial = restore_point(loop)   # loop: run_training's checked options

'newest' is the newest complete checkpoint of train_dir; a prefix elsewhere is another
run's (a new run from its weights, said so) and is refused when train_dir already
holds that step or a later one; the checkpoint must fit the graph (a misfit is named
before a session exists) and carry the input's identity (towerlib.run.global_batches).
"""

import logging
import os

import tensorflow as tf

from towerlib.run import (
    checkpoint_fit,
    checkpoint_state,
    checkpoints,
    data_position,
    global_batches,
)

__all__ = ["another_runs", "refuse_later_checkpoints", "restore_point"]

logger = logging.getLogger("towerlib")


def restore_point(loop):
    """(the checkpoint the chief restores or None, a PartialRestore when it lacks new
    optimizer slots), checked to fit the graph."""
    if not loop.is_chief:
        return None, None
    restore_from = loop.restore_from
    if restore_from == "newest":
        restore_from = checkpoints.prepare_restore(loop.train_dir)
    elif restore_from is not None:
        refuse_later_checkpoints(loop.train_dir, restore_from)
        logger.info("Restoring %s.", restore_from)
    trained = [v for _, v in loop.train_graph.grads_and_vars]
    ema = loop.train_graph.ema
    averages = {ema.average(v).op.name: v for v in trained
                if ema is not None and ema.average(v) is not None}
    # Another seed or global batch: refused before the misfit check names variables.
    resumed = global_batches.check_checkpoint(loop.graph, restore_from)
    if resumed:
        logger.warning("%s", resumed)
    with loop.graph.as_default():  # before any session: a misfit loops or trains wrong
        partial = checkpoint_fit.plan_restore(
            restore_from, loop.scaffold.saver, [v.op.name for v in trained], averages)
        unsaved = restore_from and data_position.unsaved_iterators(
            loop.train_graph.train_op)
    if unsaved and another_runs(restore_from, loop.train_dir):
        logger.info(
            "A new run in %s from %s's weights and global step (not a resume of this "
            "run): the input (%s) starts from its beginning, as any new run's does.",
            loop.train_dir, restore_from, ", ".join(unsaved))
    elif unsaved:
        logger.warning(
            "Resuming from %s, but the input (%s) starts from its beginning: its "
            "position is not in the checkpoint, so this run trains again on data it "
            "has seen and does not end where an uninterrupted run would. Fix: build "
            "the input with towerlib.saved_position_iterator(dataset).", restore_from,
            ", ".join(unsaved))
    return restore_from, partial


def refuse_later_checkpoints(train_dir, restore_from):
    """Refuses restore_from= into a train_dir that already holds a checkpoint of that
    step or a later one: the run would train from the older step, leave the steps the
    folder holds unsaved (a step with a complete checkpoint is never rewritten), and
    its result would be that other run's checkpoint. A checkpoint of train_dir itself
    (an older step the workers agreed on, towerlib.cluster.allreduce_job) is this run's:
    training on from it redoes the same steps."""
    if checkpoint_state.in_run_folder(train_dir, restore_from):
        return
    step = checkpoints.checkpoint_step(restore_from)
    if step is None:
        try:
            step = int(tf.train.load_variable(restore_from, "global_step"))
        except (ValueError, TypeError, tf.errors.OpError):
            step = 0
    later = sorted((s, p) for s, p in checkpoints.restorable_steps(train_dir).items()
                   if s >= step)
    if later:
        newest_step, newest = later[-1]
        raise checkpoints.CheckpointError(
            f"restore_from={restore_from} (global step {step}), but train_dir {train_dir} "
            f"already holds {newest} (step {newest_step}): this run would train from step "
            f"{step} beside that other run's checkpoints, save none of the steps they hold, "
            f"and return {newest} as its result. Fix: an empty train_dir to start from "
            f"{restore_from}, restore_from='newest' to continue the run in {train_dir}, or "
            "move its later checkpoints away.")


def another_runs(restore_from, train_dir):
    """Whether the checkpoint restored lies outside train_dir: another run's (a phase 2
    started from phase 1's checkpoint), so this is a new run, not a resume."""
    folder = os.path.dirname(os.path.abspath(restore_from))
    return os.path.realpath(folder) != os.path.realpath(os.path.abspath(train_dir))
