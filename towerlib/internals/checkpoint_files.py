"""The temporary files TensorFlow's checkpoint writers leave when interrupted.

A save that is killed (or whose final rename fails) leaves files under names
TensorFlow picks, which towerlib removes on the next start. As of TF 2.21:

  * '<prefix>.index.tempstate<digits>' (and the same for a data shard): the
    C++ tensor-bundle writer writes there, then renames;
  * '<prefix>_temp' (or '<prefix>_temp_<hex>'), a folder: a sharded Saver
    writes its parts there before MergeV2Checkpoints;
  * '<name>.tmp<32 hex digits>': Python's atomic_write_string_to_file, used
    for the 'checkpoint' state file.

tests/internals/test_internals.py makes TensorFlow leave each of them and fails by
name if a release changes one.
"""

import re

__all__ = ["is_tensorflow_leftover"]

_LEFTOVER = re.compile(r"(\.tempstate\d+$)|(\.tmp[0-9a-f]{32}$)|(-\d+_temp(_[0-9a-f]+)?$)")


def is_tensorflow_leftover(file_name: str) -> bool:
    """Whether `file_name` (a base name) is one of TensorFlow's temporaries."""
    return _LEFTOVER.search(file_name) is not None
