"""towerlib's run-time checks of a batch, and their failures in one line.

A batch whose size is known only at run time is checked by graph
assertions (towerlib.step.inputs, towerlib.step.accumulation). TensorFlow
reports a failed one as a long "Graph execution error"; run_training turns
an assertion of towerlib's into a DataError whose first line is the reason.

    check = tf.debugging.assert_greater_equal(batch, 4, message=run_time.message(
        "The global batch is smaller than the tower count (4)"))
"""

import re

__all__ = ["explained", "message"]

_PREFIX = "towerlib run-time check: "
_REASON = re.compile(re.escape(_PREFIX) + r"([^\]\n]*?)(?:\]|\n|Condition |$)")


def message(reason: str) -> str:
    """The assertion message for `reason`, recognizable by `explained`."""
    return _PREFIX + reason


def explained(error) -> str:
    """The reason of a failed towerlib run-time check in `error`'s text, or ''."""
    found = _REASON.search(str(getattr(error, "message", "") or error))
    return found.group(1).strip() if found else ""
