"""The Python-number settings of TensorFlow's TF 1 optimizers, read from their attributes.

tf.compat.v1.train optimizers keep their constructor's arguments in private attributes
and have no public getter. As of TF 2.21: the rate is `_learning_rate` (`_lr` for Adam
and Adadelta); MomentumOptimizer's momentum is `_momentum`, as is RMSProp's.
tests/internals/test_internals.py fails by name if a release renames one.

    settings(tf.compat.v1.train.MomentumOptimizer(0.1, momentum=5))
    # {'learning_rate': 0.1, 'momentum': 5}
"""

__all__ = ["settings"]

_RATE_ATTRIBUTES = ("_learning_rate", "_lr")


def settings(optimizer) -> dict:
    """{'learning_rate': ..., 'momentum': ...} of those the optimizer holds (any type:
    a number, a tensor, a string a flag passed by mistake)."""
    found = {}
    for attribute in _RATE_ATTRIBUTES:
        if attribute in vars(optimizer):
            found["learning_rate"] = vars(optimizer)[attribute]
            break
    if "_momentum" in vars(optimizer):
        found["momentum"] = vars(optimizer)["_momentum"]
    return found
