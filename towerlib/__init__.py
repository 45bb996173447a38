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
  run/        the training loop: hooks, checkpoints, guards, stopping, data position
  checks/     validation of options and data, build-time checks of the tower function
  cluster/    several machines
  internals/  every TensorFlow internal towerlib relies on, one module each
  layers      conv2d, dense, pooling... on tf.compat.v1.get_variable

`import towerlib` itself imports nothing heavy: each name below is imported
(with TensorFlow) the first time it is used, so towerlib-launch, which needs
no TensorFlow, starts its first task at once.
"""

import importlib

# The public names, by the module that defines each (imported on first use).
_FROM = {
    "towerlib.exchange.choice": ("CollectiveExchange", "GraphExchange"),
    "towerlib.exchange.group": ("WorkerGroup",),
    "towerlib.precision.policy": ("BFloat16", "Float16", "Float32"),
    "towerlib.update.parameter_server": ("ParameterServer",),
    "towerlib.update.replicated": ("Replicated",),
    "towerlib.update.clipping": ("ClipByGlobalNorm",),
    "towerlib.step.context": ("BN_MODES", "BnMode", "TowerContext", "TowerRecords"),
    "towerlib.step.devices": ("missing_tower_devices", "session_config", "tower_devices",
        "variable_placer"),
    "towerlib.step.evaluation": ("EvalGraph", "build_eval_graph"),
    "towerlib.step.inputs": ("split_global_batch",),
    "towerlib.step.summaries": ("strip_tower_prefix", "tower_scalar"),
    "towerlib.step.towers": ("Tower", "TowerModel", "build_towers"),
    "towerlib.step.keras_tower": ("KerasTower", "KerasTowerError"),
    "towerlib.step.build": ("build_train_graph",),
    "towerlib.step.train_graph": ("TrainGraph", "ema_restore_map"),
    "towerlib.update.aggregation": ("aggregate_gradients",),
    "towerlib.batchnorm.foreign": ("ForeignBatchNormError",),
    "towerlib.batchnorm.keras_layers": ("KerasBatchNormError",),
    "towerlib.batchnorm.normalization": ("batch_norm", "pooled_statistics"),
    "towerlib.run.checkpoints": ("CheckpointError", "find_restorable_checkpoint"),
    "towerlib.run.data_position": ("DataPositionError", "saved_position_iterator"),
    "towerlib.run.determinism": ("seed_everything",),
    "towerlib.run.evaluation_loop": ("Evaluation",),
    "towerlib.run.moving_statistics": ("check_moving_statistics",),
    "towerlib.precision.guards": ("NonFiniteError", "guard_numerics"),
    "towerlib.run.hooks": ("StepLogger",),
    "towerlib.run.trainer": ("TrainingResult", "run_training"),
    "towerlib.checks.data_checks": ("DataError", "assert_finite", "assert_labels_in_range",
        "check_record_files"),
    "towerlib.checks.validation": ("ConfigError", "ConfigProblem", "validate_config"),
}
_EXPORTS = {name: module for module, names in _FROM.items() for name in names}
# The public submodules, by the name towerlib gives each.
_SUBMODULES = {
    "cluster": "towerlib.cluster",
    "exchange": "towerlib.exchange",
    "layers": "towerlib.layers",
    "optimizers": "towerlib.optimizers",
    "schedules": "towerlib.schedules",
    "mixed_precision": "towerlib.precision.casting",
    "hooks": "towerlib.run.hooks",
    "loss_scaling": "towerlib.precision.loss_scaling",
}

__version__ = "0.1.0"

__all__ = [
    # The strategies.
    "BFloat16", "ClipByGlobalNorm", "CollectiveExchange", "Float16", "Float32", "GraphExchange",
    "ParameterServer", "Replicated", "WorkerGroup",
    # Building and running the training step.
    "BN_MODES", "BnMode", "EvalGraph", "Evaluation", "KerasTower", "StepLogger", "Tower", "TowerContext", "TowerModel",
    "TowerRecords", "TrainGraph", "TrainingResult", "aggregate_gradients",
    "batch_norm", "build_eval_graph", "build_towers", "build_train_graph", "ema_restore_map",
    "pooled_statistics", "run_training", "session_config", "split_global_batch",
    "strip_tower_prefix", "tower_devices", "tower_scalar", "variable_placer",
    "missing_tower_devices",
    # Submodules.
    "cluster", "exchange", "hooks", "layers", "loss_scaling", "mixed_precision", "optimizers",
    "schedules",
    # Faults: checkpoints, NaN guard, validation, data checks, determinism.
    "CheckpointError", "ConfigError", "ConfigProblem", "DataError", "ForeignBatchNormError",
    "KerasBatchNormError", "KerasTowerError",
    "NonFiniteError", "assert_finite", "assert_labels_in_range",
    "check_moving_statistics", "check_record_files", "find_restorable_checkpoint",
    "guard_numerics",
    # The input pipeline's position in checkpoints.
    "DataPositionError", "saved_position_iterator",
    "seed_everything", "validate_config",
]


def __getattr__(name):
    """The public name `name`, imported on first use (PEP 562) and kept."""
    if name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'towerlib' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
