"""What in a run folder is towerlib's: its control entries, checked before each use.

towerlib writes, replaces and deletes a few entries of a run folder by name:
the lock file, the `checkpoint` state file, the `.saving` staging folder and
the `best/` folder of an Evaluation. Before it touches one, and before it
opens one:

  - a symbolic link there is refused, never followed (it would write into,
    or empty, what the link points at);
  - a control file that is not a regular file (a FIFO, a folder, a device)
    is refused, found with os.lstat before any open, and opened with
    O_NONBLOCK | O_NOFOLLOW besides: a FIFO planted there cannot block;
  - a file with several hard links is refused where towerlib writes in place
    (the lock file): writing it would write the other name's file;
  - a folder of towerlib's (`.saving`, `best/`) is towerlib's only while every
    entry in it has a name towerlib writes there; anything else makes it a
    user's folder, refused in one line naming what it holds, and nothing in
    it is written or deleted.

Each refusal is one line, a ControlEntryError (a CheckpointError), naming the
entry, what it is and the fix. Remote folders (gs://, s3://) have no links,
FIFOs or inodes and are not checked.
"""

import errno
import os
import stat

import tensorflow as tf

__all__ = ["CheckpointError", "ControlEntryError", "DiskFullError", "LinkedEntryError",
           "check_file", "check_folder", "claim_folder", "disk_full_reason", "is_regular_file",
           "linked_error", "open_regular", "ours"]


class CheckpointError(RuntimeError):
    """No checkpoint in train_dir can be restored, though some were written."""


class DiskFullError(CheckpointError):
    """A save ran out of space; the checkpoints saved before it are intact."""


_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def disk_full_reason(error):
    """'no space left on device' or 'disk quota exceeded' when `error` (an OSError, or
    TensorFlow's error for a failed write) says so; else None."""
    if isinstance(error, OSError):
        return _FULL.get(error.errno)
    if isinstance(error, tf.errors.OpError):
        text = str(error).lower()
        return next((reason for reason in _FULL.values() if reason in text), None)
    return None


class ControlEntryError(CheckpointError):
    """An entry of train_dir that towerlib writes by name is not one towerlib wrote."""


class LinkedEntryError(ControlEntryError):
    """A control entry of train_dir is a symbolic link, which towerlib will not follow."""


def _local(path):
    return "://" not in str(path)


def _lstat(path):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def linked_error(path):
    name, folder = os.path.basename(path), os.path.dirname(path)
    return LinkedEntryError(
        f"{folder}: {name} -> {os.readlink(path)} is a symbolic link, and towerlib writes "
        f"and deletes {name} itself, never through a link (it would overwrite or empty "
        "what the link points at). Fix: remove the link (its target is left as it is), "
        "or train into another train_dir.")


def _not_ours(path, what, fix="move it away (towerlib then creates its own)"):
    return ControlEntryError(
        f"{path} is {what}, not what towerlib writes there; towerlib neither opens, "
        f"writes nor deletes it. Fix: {fix}, or train into another train_dir.")


def check_file(path, single_link=False):
    """Raises ControlEntryError (one line) unless `path` is absent or a regular file
    (with one link when `single_link`: a file towerlib writes in place); never opens it."""
    path = str(path)
    if not _local(path):
        return
    info = _lstat(path)
    if info is None or stat.S_ISREG(info.st_mode) and not (
            single_link and info.st_nlink > 1):
        return
    if stat.S_ISLNK(info.st_mode):
        raise linked_error(path)
    if stat.S_ISREG(info.st_mode):
        raise _not_ours(path, f"a file with {info.st_nlink} hard links (writing it would "
                        "write the file of every other name)")
    raise _not_ours(path, _kind(info.st_mode))


def is_regular_file(path):
    """Whether `path` is a regular file (not a link, FIFO or folder); remote: exists."""
    if not _local(path):
        return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)
    info = _lstat(path)
    return info is not None and stat.S_ISREG(info.st_mode)


def open_regular(path, flags=os.O_RDONLY, single_link=False):
    """os.open of a regular file that never blocks and never follows a link: O_NONBLOCK
    and O_NOFOLLOW, then fstat; anything else is closed and refused (check_file's
    error). Returns the descriptor."""
    check_file(path, single_link)
    fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0))
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and not (single_link and info.st_nlink > 1):
        return fd
    os.close(fd)
    if stat.S_ISREG(info.st_mode):
        raise _not_ours(path, f"a file with {info.st_nlink} hard links (writing it would "
                        "write the file of every other name)")
    raise _not_ours(path, _kind(info.st_mode))


def ours(folder, names_ours):
    """Raises ControlEntryError unless every entry of `folder` (an existing real folder)
    has a name `names_ours(name)` accepts: what towerlib writes there."""
    foreign = sorted(n for n in os.listdir(folder) if not names_ours(n))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise _not_ours(folder, f"a folder towerlib did not write (it holds {shown})",
                        "move it away (nothing in it was touched)")


def check_folder(folder):
    """Raises ControlEntryError unless `folder` is absent or a real folder (no link)."""
    folder = str(folder)
    if not _local(folder):
        return
    info = _lstat(folder)
    if info is None or stat.S_ISDIR(info.st_mode):
        return
    if stat.S_ISLNK(info.st_mode):
        raise linked_error(folder)
    raise _not_ours(folder, "a file" if stat.S_ISREG(info.st_mode) else _kind(info.st_mode))


def claim_folder(folder, names_ours):
    """`folder`, created when absent; an existing one must be a real folder (no link)
    holding only what towerlib writes there (`ours`), else ControlEntryError."""
    folder = str(folder)
    if not _local(folder):
        tf.io.gfile.makedirs(folder)
        return folder
    check_folder(folder)
    if os.path.isdir(folder):
        ours(folder, names_ours)
    else:
        os.makedirs(folder, exist_ok=True)
    return folder
