"""TensorFlow error message texts towerlib recognizes.

Some failures reach Python only as an OpError whose class is too broad to
act on (DeadlineExceededError for both a collective's own timeout and a run
deadline; ValueError for a variable that does not exist). The texts matched
here are TensorFlow's, from TF 2.21; tests/internals/test_internals.py and
tests/step/test_tower_batch_errors.py provoke each one and fail by name if a
release rewords it.
"""

__all__ = ["is_collective_timeout", "is_existing_variable", "is_foreign_graph_element",
           "is_fused_batch_norm_dtype",
           "is_missing_variable",
           "is_port_taken", "is_run_deadline",
           "is_shape_mismatch", "names_assert", "timeout_line"]

# A collective op's own timeout, or a collective aborted by another's failure.
_COLLECTIVE_TIMEOUT_TEXTS = ("Collective has timed out", "Collective ops is aborted")
# Session.run's deadline (RunOptions.timeout_in_ms or
# ConfigProto.operation_timeout_in_ms): it does not name the op still running.
_RUN_DEADLINE_TEXT = "Timed out waiting for notification"
# get_variable(reuse=True) of a name no earlier tower created.
_MISSING_VARIABLE_TEXT = "does not exist"
# A tensor of the outer graph used inside a function body without a capture.
_FOREIGN_ELEMENT_TEXT = "is not an element of this graph"
# get_variable creating a name the graph already has (without reuse).
_EXISTING_VARIABLE_TEXT = "already exists, disallowed"
# FusedBatchNormV3 built with half scale/offset (cast by towerlib's storage
# getter) next to float32 statistics: bfloat16 and float16 word it differently.
_FUSED_BATCH_NORM_DTYPE_TEXTS = ("'FusedBatchNorm", "parameter 'scale' has DataType")
# Graph-construction shape errors (ValueError) of two tensors that disagree.
_SHAPE_MISMATCH_TEXTS = (
    "must equal `logits.shape` except for the last dimension",  # sparse cross entropy
    "Dimensions must be equal, but are",  # binary ops, softmax cross entropy
    "in both shapes must be equal, but are",  # concat and other merges
    "must be evenly divisible by",  # reshape to a fixed first dimension and -1
    "Cannot reshape a tensor with",  # reshape to a fully fixed shape
    "are incompatible",  # tf.compat.v1.losses, set_shape
)


# tf.distribute.Server on an address it cannot bind (the port taken).
_SERVER_BIND_TEXT = "Could not start gRPC server"


def is_port_taken(message: str) -> bool:
    return _SERVER_BIND_TEXT in (message or "")


def is_collective_timeout(message: str) -> bool:
    return any(text in (message or "") for text in _COLLECTIVE_TIMEOUT_TEXTS)


def is_run_deadline(message: str) -> bool:
    return _RUN_DEADLINE_TEXT in (message or "")


def is_missing_variable(error: Exception) -> bool:
    return _MISSING_VARIABLE_TEXT in str(error)


def is_existing_variable(error: Exception) -> bool:
    return _EXISTING_VARIABLE_TEXT in str(error)


def is_foreign_graph_element(error: Exception) -> bool:
    return _FOREIGN_ELEMENT_TEXT in str(error)


def is_fused_batch_norm_dtype(error: Exception) -> bool:
    return any(text in str(error) for text in _FUSED_BATCH_NORM_DTYPE_TEXTS)


def is_shape_mismatch(error: Exception) -> bool:
    """Whether `error` is TensorFlow's build-time complaint about disagreeing shapes.

    Covers sparse_softmax_cross_entropy_with_logits' labels/logits check, the
    shape inference of binary ops, concat and reshape, and the compatibility
    check of tf.compat.v1.losses (tests/step/test_tower_batch_errors.py provokes
    each). towerlib adds an explanation when the numbers are the per-tower
    and global batch sizes.
    """
    return any(text in str(error) for text in _SHAPE_MISMATCH_TEXTS)


def timeout_line(message: str) -> str:
    """The line of `message` that says which timeout fired, or ''."""
    texts = _COLLECTIVE_TIMEOUT_TEXTS + (_RUN_DEADLINE_TEXT,)
    return next((line.strip() for line in (message or "").splitlines()
                 if any(text in line for text in texts)), "")


def names_assert(error: Exception, first_item: str) -> bool:
    """Whether `error` is a failed tf.debugging.Assert whose first data item is `first_item`.

    TensorFlow formats an Assert's data as "[item] [item] ..." after
    "assertion failed: "; an Assert inside a cond gives no op to compare,
    so the guard recognizes its own by the text it put first.
    """
    return f"[{first_item}" in str(error)
