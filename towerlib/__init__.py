"""towerlib: one tower function, many devices, one optimizer step per global batch.

    import towerlib
    train = towerlib.build_train_graph(model, (images, labels), optimizer,
                                       num_towers=4, bn_mode="all_towers")
    with tf.compat.v1.Session(config=towerlib.session_config(4)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train.train_op)

The packages, by concern:

  step/       building the training step: towers, contexts, the objective, the apply
  update/     how gradients reach the variables: parameter server, replicated copies
  precision/  compute dtypes and loss scaling
  batchnorm/  batch norm across towers: the modes, the TF 1 layer swap, foreign layers
  exchange/   cross-tower reductions (sync batch norm, the all-reduce)
  data/       record sources read by index (TFRecords, fixed-length), the read order
  run/        the training loop: hooks, checkpoints, guards, stopping, data position
  checks/     validation of options and data, build-time checks of the tower function
  cluster/    several machines
  internals/  every TensorFlow internal towerlib relies on, one module each
  layers      conv2d, dense, pooling... on tf.compat.v1.get_variable

`import towerlib` imports nothing heavy: each public name is imported (with
TensorFlow) the first time it is used (PEP 562), so towerlib-launch, which
needs no TensorFlow, starts its first task at once. The imports below, under
TYPE_CHECKING, are the one list of those names: type checkers, IDEs and the
API reference read them as written, and `towerlib.lazy_names` reads them to import
each name on first use.
"""

from typing import TYPE_CHECKING

from towerlib.lazy_names import lazy_loader

if TYPE_CHECKING:
    from towerlib import cluster, exchange, layers, optimizers, schedules

    # The strategies, each an object chosen by the user (strings name the defaults).
    from towerlib.exchange.choice import CollectiveExchange, GraphExchange
    from towerlib.exchange.group import WorkerGroup
    from towerlib.precision.choice import BFloat16, Float16, Float32
    from towerlib.update.parameter_server import ParameterServer
    from towerlib.update.replicated import Replicated
    from towerlib.update.clipping import ClipByGlobalNorm
    from towerlib.update.holdings import replica_bytes

    # Building the training step.
    from towerlib.step.context import BN_MODES, BnMode, TowerContext, TowerRecords
    from towerlib.step.devices import (missing_tower_devices, session_config, tower_devices,
                                       variable_placer)
    from towerlib.step.evaluation import EvalGraph, build_eval_graph
    from towerlib.step.inputs import split_global_batch
    from towerlib.step.summaries import strip_tower_prefix, tower_scalar
    from towerlib.step.towers import Tower, TowerModel, build_towers
    from towerlib.keras.tower import KerasTower, KerasTowerError
    from towerlib.step.build import build_train_graph
    from towerlib.step.train_graph import TrainGraph, ema_restore_map
    from towerlib.update.aggregation import aggregate_gradients

    # Precision.
    from towerlib.precision import casting as mixed_precision
    from towerlib.precision import loss_scaling

    # Batch norm.
    from towerlib.batchnorm.foreign import ForeignBatchNormError
    from towerlib.batchnorm.keras_layers import KerasBatchNormError
    from towerlib.batchnorm.normalization import batch_norm, pooled_statistics

    # Running: the loop, its hooks, checkpoints, faults.
    from towerlib.run import hooks
    from towerlib.run.checkpoints import CheckpointError, find_restorable_checkpoint
    from towerlib.run.run_entries import DiskFullError
    from towerlib.run.data_position import DataPositionError, saved_position_iterator
    from towerlib.run.determinism import seed_everything
    from towerlib.data.order import global_batch_examples
    from towerlib.data.sources import FixedLengthRecords, TFRecords
    from towerlib.run.global_batches import global_batch_input
    from towerlib.run.evaluation_loop import Evaluation
    from towerlib.run.moving_statistics import check_moving_statistics
    from towerlib.precision.guards import NonFiniteError, guard_numerics
    from towerlib.run.hooks import StepLogger
    from towerlib.run.trainer import TrainingResult, run_training
    from towerlib.run.warm_start import WarmStart

    # Checks.
    from towerlib.checks.data_checks import (DataError, assert_finite, assert_labels_in_range,
                                             check_record_files)
    from towerlib.run.validation import ConfigError, ConfigProblem, validate_config

__version__ = "0.1.0"

__all__ = [
    # The strategies.
    "BFloat16", "ClipByGlobalNorm", "CollectiveExchange", "Float16", "Float32", "GraphExchange",
    "ParameterServer", "Replicated", "WorkerGroup", "replica_bytes",
    # Building and running the training step.
    "BN_MODES", "BnMode", "EvalGraph", "Evaluation", "KerasTower", "StepLogger", "Tower", "TowerContext", "TowerModel",
    "TowerRecords", "TrainGraph", "TrainingResult", "WarmStart", "aggregate_gradients",
    "batch_norm", "build_eval_graph", "build_towers", "build_train_graph", "ema_restore_map",
    "pooled_statistics", "run_training", "session_config", "split_global_batch",
    "strip_tower_prefix", "tower_devices", "tower_scalar", "variable_placer",
    "missing_tower_devices",
    # Submodules.
    "cluster", "exchange", "hooks", "layers", "loss_scaling", "mixed_precision", "optimizers",
    "schedules",
    # Faults: checkpoints, NaN guard, validation, data checks, determinism.
    "CheckpointError", "ConfigError", "ConfigProblem", "DataError", "DiskFullError",
    "ForeignBatchNormError",
    "KerasBatchNormError", "KerasTowerError",
    "NonFiniteError", "assert_finite", "assert_labels_in_range",
    "check_moving_statistics", "check_record_files", "find_restorable_checkpoint",
    "guard_numerics",
    # The input pipeline's position in checkpoints.
    "DataPositionError", "FixedLengthRecords", "TFRecords", "global_batch_examples",
    "global_batch_input",
    "saved_position_iterator",
    "seed_everything", "validate_config",
]


__getattr__ = lazy_loader(__name__, __file__)


def __dir__():
    return sorted(set(globals()) | set(__all__))
