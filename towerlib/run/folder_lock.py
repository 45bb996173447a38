"""One trainer per train_dir: an flock on train_dir/.towerlib-lock.

Two trainers writing one folder interleave their checkpoints (each restores
the other's, then saves over it). `hold(train_dir)` takes an exclusive,
non-blocking `fcntl.flock` on a file in the folder and writes this
process's pid and host into it; a second trainer is refused in one line
naming the folder and that pid. The kernel releases the lock when the
process ends, however it ends (a SIGKILL too), so a dead trainer never
leaves the folder held; the file itself stays, harmless. Remote folders
(gs://, s3://) and systems without fcntl are not locked.

towerlib never writes or deletes through a link it did not create: a run
folder whose control entries (the lock file, the `.saving` staging folder,
the `checkpoint` state file) are symbolic links, or of another kind than
towerlib makes them (a FIFO, a folder where a file belongs, a lock file with
several hard links), is refused in one line (`refuse_linked_entries`,
towerlib.run.run_entries), and the lock file is opened with O_NOFOLLOW and
O_NONBLOCK (and created with O_EXCL), so nothing planted there can make
towerlib write into a user's file, empty a user's folder, or block. A
train_dir that is a link to nothing is refused in one line too.
"""

import errno
import os
import socket

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None

from towerlib.run import durable_files, run_entries
from towerlib.run.checkpoint_state import SAVING_DIRNAME, STATE_FILENAME, CheckpointError
from towerlib.run.run_entries import ControlEntryError, LinkedEntryError

LOCK_FILENAME = ".towerlib-lock"
# The entries of a run folder that towerlib writes, replaces or deletes by name.
CONTROL_ENTRIES = (LOCK_FILENAME, SAVING_DIRNAME, STATE_FILENAME)

__all__ = ["CONTROL_ENTRIES", "LOCK_FILENAME", "ControlEntryError", "FolderLock",
           "LinkedEntryError",
           "TrainDirInUseError", "hold", "refuse_linked_entries"]


class TrainDirInUseError(CheckpointError):
    """Another process holds train_dir (it trains into it)."""


def _linked_error(train_dir, names):
    links = ", ".join(f"{name} -> {os.readlink(os.path.join(train_dir, name))}"
                      if os.path.islink(os.path.join(train_dir, name)) else name
                      for name in names)
    return LinkedEntryError(
        f"{train_dir}: {links} is a symbolic link, and towerlib writes and deletes "
        f"{', '.join(names)} itself, never through a link (it would overwrite or empty "
        "what the link points at). Fix: remove the link (its target is left as it is), "
        "or train into another train_dir.")


def refuse_linked_entries(train_dir):
    """Raises LinkedEntryError (one line) when a CONTROL_ENTRIES name in train_dir is a
    symbolic link, ControlEntryError when one is of another kind than towerlib makes it
    (the lock a FIFO, a folder or a file of several links; the state file not a regular
    file; .saving not a folder). Nothing is opened. A no-op for remote folders."""
    train_dir = str(train_dir)
    if not durable_files.is_local(train_dir):
        return
    if os.path.islink(train_dir) and not os.path.exists(train_dir):
        raise ControlEntryError(
            f"train_dir {train_dir} is a symbolic link to {os.readlink(train_dir)}, which "
            "does not exist. Fix: create that folder, or remove the link (a folder is "
            "then made there).")
    linked = [name for name in CONTROL_ENTRIES
              if os.path.islink(os.path.join(train_dir, name))]
    if linked:
        raise _linked_error(train_dir, linked)
    run_entries.check_file(os.path.join(train_dir, LOCK_FILENAME), single_link=True)
    run_entries.check_file(os.path.join(train_dir, STATE_FILENAME))
    run_entries.check_folder(os.path.join(train_dir, SAVING_DIRNAME))


def _open_lock_file(train_dir, path):
    """The lock file, created exclusively or opened as it is, never through a link."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:   # a dead trainer's: harmless, reused; never a FIFO
            fd = run_entries.open_regular(path, os.O_RDWR, single_link=True)
    except OSError as error:
        if error.errno == errno.ELOOP:   # a link planted after refuse_linked_entries
            raise _linked_error(train_dir, [LOCK_FILENAME]) from None
        raise
    return os.fdopen(fd, "r+", encoding="utf-8")


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
        with os.fdopen(run_entries.open_regular(path), encoding="utf-8") as handle:
            return handle.read().strip()
    except (OSError, ControlEntryError):
        return ""


def hold(train_dir):
    """Takes train_dir for this process; returns a FolderLock to release.

    Raises:
      TrainDirInUseError: another process holds it (its pid named if known).
      LinkedEntryError: a control entry of train_dir is a symbolic link.
      ControlEntryError: one is a FIFO, a folder or a file of several hard links.
    """
    train_dir = str(train_dir)
    refuse_linked_entries(train_dir)
    if fcntl is None or not durable_files.is_local(train_dir):
        return FolderLock()
    path = os.path.join(train_dir, LOCK_FILENAME)
    handle = _open_lock_file(train_dir, path)
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
