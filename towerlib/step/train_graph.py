"""What `build_train_graph` returns: the training step's tensors and ops.

    train = towerlib.build_train_graph(model, (images, labels), optimizer, num_towers=4)
    session.run([train.train_op, train.loss])   # one optimizer step, its mean loss

The step's objective is in towerlib.step.objective, its assembly in
towerlib.step.build.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from towerlib.exchange.safety import PeerTimeoutError
from towerlib.step import inputs as inputs_lib
from towerlib.step.context import TowerContext
from towerlib.step.options import check_ema_decay

__all__ = ["TrainGraph", "ema_restore_map"]


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
      variable_update: the update's name, 'parameter_server' or 'replicated'.
      variable_copies: with 'replicated', {tower 0's variable name: every
        tower's copy, in tower order} for the weights, moving statistics and
        optimizer slots; {} otherwise.
      sync_copies_op: with 'replicated', an op copying tower 0's values into
        the other towers' copies: run it after restoring tower 0's variables
        in a plain Session (run_training needs none); else None.
      loss_scale: the towerlib.precision.loss_scaling.LossScale of a float16 build
        (run_training adds its floor hook), else None.
      broadcast_op: across workers, the op that sets every copy on every
        worker to the chief's values; every worker runs it once after
        initializing or restoring, before its first step (run_training
        does; `initialize` too). None on one machine.
      accumulation_buffers: with accumulation_steps > 1, the resource
        handles of the step-local buffers the loop keeps its sums in (zeroed
        at the start of every step; not variables: in no collection, never
        saved or initialized); () otherwise.
      gradient_norm: with clipping=ClipByGlobalNorm(...), the step's global
        gradient norm before clipping (float32 scalar, also a summary); else None.
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
    broadcast_op: Any = None
    accumulation_buffers: Tuple[Any, ...] = ()
    gradient_norm: Any = None

    def initialize(self, session, timeout_secs=600.0):
        """Initializes every variable for a plain Session (run_training needs none).

        The global variables first, then, in a separate run, the local ones:
        replicated copies (and their slots) read tower 0's initialized values.
        After restoring tower 0's variables from a checkpoint instead, run
        `sync_copies_op` (when not None), then `tf.compat.v1.tables_initializer()`
        (towerlib.global_batch_input's iterator starts at the restored position).

        Across workers (built with `workers=`) the chief's values are then
        broadcast to every worker, which waits for all of them: at most
        `timeout_secs`, then PeerTimeoutError (a TimeoutError) naming the fix. A
        Session of this process alone (no server target) can never reach the
        other workers: ValueError at once, before anything runs. Bound each training
        step in your own Session too: set `operation_timeout_in_ms` in its
        ConfigProto (a step waiting for a lost worker then raises
        DeadlineExceededError instead of waiting forever).
        """
        # Both ops built before the first run: grouping ops into a new op after a
        # session ran them mutates them (TensorFlow warns, and will refuse).
        if self.broadcast_op is not None:
            _check_reaches_other_workers(session)
        global_init = tf.compat.v1.global_variables_initializer()
        local_init = [tf.compat.v1.local_variables_initializer(),
                      tf.compat.v1.tables_initializer()]
        input_init = self.train_op.graph.get_collection(inputs_lib.INPUT_INITIALIZERS)
        session.run(global_init)
        session.run(local_init)  # tables_initializer starts global_batch_input's iterator
        if self.broadcast_op is not None:
            options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(timeout_secs * 1000)))
            try:
                session.run(self.broadcast_op, options=options)
            except tf.errors.DeadlineExceededError:
                raise PeerTimeoutError(
                    f"initialize: the chief's broadcast to every worker did not complete "
                    f"within {timeout_secs:g} s: a worker of the group has not started or "
                    "has not called initialize. Fix: start every worker (each one "
                    "initializes), or give initialize a longer timeout_secs.") from None
            if input_init:  # the chief's position, now every worker's
                session.run(input_init)


def _check_reaches_other_workers(session):
    """Refuses a Session with no server target: its broadcast would wait forever."""
    target = getattr(session, "sess_str", None)
    if target is not None and not target:
        raise ValueError(
            "initialize: this step was built for several workers (workers=WorkerGroup(...)) "
            "but the Session belongs to this process alone (no server target), so the "
            "other workers are not there and the broadcast would wait for them. Fix: "
            "start every worker's process and use tf.compat.v1.Session(server.target), or "
            "train with towerlib.cluster.run_distributed_training, which does both.")


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
