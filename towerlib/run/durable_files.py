"""File operations that survive a kill: fsync, atomic rename, atomic text files.

Used by the checkpoint writer and the state file. Callers go through this
module's attributes (``durable_files.rename(...)``), so a fault-injection
test can replace one of them for the whole library.
"""

import os
import uuid

import tensorflow as tf

__all__ = ["atomic_write_text", "fsync_dir", "fsync_file", "is_local", "remove_file",
           "rename"]


def is_local(path):
    """Whether `path` is on the local file system (no 'gs://', 's3://', ...)."""
    return "://" not in str(path)


def fsync_file(path):
    """Flushes `path`'s contents to disk (local files; a no-op elsewhere)."""
    if not is_local(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    """Makes renames and deletions in `path` durable (POSIX; a no-op elsewhere)."""
    if not is_local(path) or not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename(source, target):
    """Atomically replaces `target` by `source` (same directory tree)."""
    if is_local(source):
        os.replace(source, target)
    else:
        tf.io.gfile.rename(source, target, overwrite=True)


def remove_file(path):
    """Deletes `path` if it exists."""
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def atomic_write_text(path, text, temporary_dir=None):
    """Writes `text` to `path` so that readers see the old file or the new one.

    The text goes to a temporary file in the same directory, which is fsynced
    and then renamed over `path`; the directory is fsynced after the rename.
    A failure at any point (a full disk, say) removes the temporary file. The
    temporary is created exclusively and never through a link (O_EXCL,
    O_NOFOLLOW), and the rename replaces a link at `path` rather than its
    target. `temporary_dir` (a folder of towerlib's on the same file system,
    e.g. train_dir/.saving) holds the temporary instead of path's folder, so
    that a kill leaves it where only towerlib's files are.
    """
    directory = os.path.dirname(path) or "."
    temporary = os.path.join(temporary_dir or directory,
                             f"{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
    try:
        if is_local(path):
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        else:
            with tf.io.gfile.GFile(temporary, "w") as handle:
                handle.write(text)
        rename(temporary, path)
    except BaseException:
        remove_file(temporary)
        raise
    fsync_dir(directory)
