"""One trainer per train_dir: an flock on train_dir/.towerlib-lock.

Two trainers writing one folder interleave their checkpoints (each restores
the other's, then saves over it). `hold(train_dir)` takes an exclusive,
non-blocking `fcntl.flock` on a file in the folder and writes this
process's pid and host into it; a second trainer is refused in one line
naming the folder and that pid. The kernel releases the lock when the
process ends, however it ends (a SIGKILL too), so a dead trainer never
leaves the folder held; the file itself stays, harmless. Remote folders
(gs://, s3://) and systems without fcntl are not locked.
"""

import os
import socket

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None

from towerlib.run.checkpoint_state import CheckpointError
from towerlib.run import durable_files

LOCK_FILENAME = ".towerlib-lock"

__all__ = ["LOCK_FILENAME", "FolderLock", "TrainDirInUseError", "hold"]


class TrainDirInUseError(CheckpointError):
    """Another process holds train_dir (it trains into it)."""


class FolderLock:
    """A held train_dir; `release()` (idempotent) lets another trainer in."""

    def __init__(self, handle=None):
        self._handle = handle

    def release(self):
        if self._handle is not None:
            self._handle.close()  # closing the descriptor drops the flock
            self._handle = None


def _holder(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def hold(train_dir):
    """Takes train_dir for this process; returns a FolderLock to release.

    Raises:
      TrainDirInUseError: another process holds it (its pid named if known).
    """
    train_dir = str(train_dir)
    if fcntl is None or not durable_files.is_local(train_dir):
        return FolderLock()
    path = os.path.join(train_dir, LOCK_FILENAME)
    handle = open(path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        holder = _holder(path)
        who = f"process {holder}" if holder.startswith("pid ") else "another process"
        raise TrainDirInUseError(
            f"{train_dir} is in use: {who} is training into it (it holds {path}). "
            "Fix: wait for it to end or stop it, or train into another train_dir.") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return FolderLock(handle)
