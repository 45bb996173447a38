"""A value a tf.compat.v1.train.Saver saves under a name, and how it restores it.

`saveable_object.SaveableObject` is what the Saver saves besides variables (a
dataset iterator's state is one): one tensor per name to save, and a `restore`
that takes the tensors read back. towerlib saves the optimizer slots sharded over
workers through it (towerlib.update.slot_shards): each worker saves the whole slot,
gathered from its owner, and restores only the slots it owns.
tests/internals/test_internals_saveables.py fails if a release moves or changes it.
"""

from tensorflow.python.training.saving import saveable_object

__all__ = ["TensorSaveable"]


class TensorSaveable(saveable_object.SaveableObject):
    """Saves `tensor` under `name`; restoring calls `restore_fn(tensor read back)`.

    Args:
      tensor: the value to save (its device is where the Saver writes it from).
      name: the name in the checkpoint.
      restore_fn: tensor -> the op that takes the restored value.
    """

    def __init__(self, tensor, name, restore_fn):
        spec = saveable_object.SaveSpec(tensor, "", name, dtype=tensor.dtype,
                                        device=tensor.device)
        super().__init__(tensor, [spec], name)
        self._restore_fn = restore_fn

    @property
    def shape(self):
        """The saved tensor's shape (what towerlib.run.checkpoint_fit compares)."""
        return self.op.shape

    @property
    def dtype(self):
        """The saved tensor's dtype."""
        return self.op.dtype

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        return self._restore_fn(restored_tensors[0])
