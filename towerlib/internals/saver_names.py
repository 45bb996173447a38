"""The names a tf.compat.v1.train.Saver saves its variables under.

`saveable_object_util.op_list_to_dict(var_list)` is what the Saver itself calls to map
checkpoint names to variables (a partitioned variable's parts under one name, a
resource variable under its op name). run_training compares those names, shapes and
dtypes with a checkpoint's before restoring (towerlib.run.checkpoint_fit).
tests/internals/test_internals_saver_names.py fails if a release moves or changes it.
"""

from tensorflow.python.training.saving import saveable_object_util

__all__ = ["saver_names"]


def saver_names(var_list):
    """{name in the checkpoint: variable} for a Saver's var_list."""
    return saveable_object_util.op_list_to_dict(var_list)
