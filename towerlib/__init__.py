"""towerlib: one tower function, many devices, one optimizer step per global batch.

    import towerlib
    train = towerlib.build_train_graph(model, (images, labels), optimizer,
                                       num_towers=4, bn_mode="all_towers")
    with tf.compat.v1.Session(config=towerlib.session_config(4)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train.train_op)

Cross-tower reductions (bn_mode="sync") are in towerlib.exchange, the
training loop's hooks in towerlib.hooks, several machines in towerlib.cluster.
"""

from towerlib import (cluster, collective, exchange, hooks, layers, loss_scaling,
                      mixed_precision)
from towerlib.checkpoints import CheckpointError, find_restorable_checkpoint
from towerlib.context import BN_MODES, TowerContext, TowerRecords
from towerlib.data_position import DataPositionError, saved_position_iterator
from towerlib.data_checks import (DataError, assert_finite, assert_labels_in_range,
                                  check_record_files)
from towerlib.determinism import seed_everything
from towerlib.evaluation import EvalGraph, build_eval_graph
from towerlib.foreign_batch_norm import ForeignBatchNormError
from towerlib.devices import (missing_tower_devices, session_config, tower_devices,
                              variable_placer)
from towerlib.gradients import aggregate_gradients
from towerlib.guards import NonFiniteError, guard_numerics
from towerlib.inputs import split_global_batch
from towerlib.normalization import batch_norm, pooled_statistics
from towerlib.summaries import strip_tower_prefix, tower_scalar
from towerlib.towers import Tower, TowerModel, build_towers
from towerlib.train_graph import TrainGraph, build_train_graph, ema_restore_map
from towerlib.hooks import StepLogger
from towerlib.trainer import TrainingResult, run_training
from towerlib.validation import ConfigError, ConfigProblem, validate_config

__version__ = "0.1.0"

__all__ = [
    # Building and running the training step.
    "BN_MODES", "EvalGraph", "StepLogger", "Tower", "TowerContext", "TowerModel",
    "TowerRecords", "TrainGraph", "TrainingResult", "aggregate_gradients",
    "batch_norm", "build_eval_graph", "build_towers", "build_train_graph", "ema_restore_map",
    "pooled_statistics", "run_training", "session_config", "split_global_batch",
    "strip_tower_prefix", "tower_devices", "tower_scalar", "variable_placer",
    "missing_tower_devices",
    # Submodules.
    "cluster", "collective", "exchange", "hooks", "layers", "loss_scaling",
    "mixed_precision",
    # Faults: checkpoints, NaN guard, validation, data checks, determinism.
    "CheckpointError", "ConfigError", "ConfigProblem", "DataError", "ForeignBatchNormError",
    "NonFiniteError", "assert_finite", "assert_labels_in_range",
    "check_record_files", "find_restorable_checkpoint", "guard_numerics",
    # The input pipeline's position in checkpoints.
    "DataPositionError", "saved_position_iterator",
    "seed_everything", "validate_config",
]
