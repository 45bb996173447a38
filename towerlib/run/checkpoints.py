"""Crash-safe checkpoints: a kill at any moment leaves the last complete one restorable.

What TensorFlow 2.21 does on its own (traced with strace, `Saver.save` with
the `Scaffold`'s default sharded saver, as `MonitoredTrainingSession` uses):

  1. the data shard is written to `<prefix>_temp/part-...data...tempstate<N>`
     and renamed; the shard's index likewise;
  2. the shards are merged: the data file is *renamed* to its final name
     `<prefix>.data-00000-of-00001` and the merged index is written *in place*
     (`open(<prefix>.index, O_TRUNC)`, no temporary file);
  3. the `checkpoint` state file is replaced atomically (temp file + rename);
  4. the `.meta` graph is written (temp file + rename), after the state.

Nothing is fsynced. So a SIGKILL during step 2 can leave a half-written
`.index`, and when the prefix already existed (the restarted chief saves
the step it just restored, which TensorFlow's CheckpointSaverHook does at
session creation) the state file points at that half-written checkpoint:
the next restart fails with "not an sstable (bad magic number)".

What `CheckpointWriter` does instead:

  1. `Saver.save` writes into `<train_dir>/.saving/`, which nothing reads;
  2. every file is fsynced, then the data shards and the `.meta` are renamed
     into `train_dir`, and the `.index` last: a checkpoint whose `.index`
     exists in `train_dir` is complete;
  3. the state file (TensorFlow's own `checkpoint` text format, so
     `tf.train.latest_checkpoint` and TensorBoard keep working) is written to a
     temporary file, fsynced and `os.replace`d, then the directory is fsynced;
  4. old checkpoints beyond `max_to_keep` are dropped from the state first
     and deleted after, `.index` first, so a half-deleted one is incomplete.

Before publishing, the writer names the files it is about to publish or
delete in a journal, `.saving/publishing` (removed after), each with its
inode: a restart after a kill removes those of a checkpoint without an index
that still are the files recorded (same name, same inode), and no other file.

towerlib deletes only what it wrote: `.saving` when it holds only names its
writer gives (else it is a user's folder, refused in one line: run_entries),
the journal's recorded files, and old checkpoints of this folder (never one a
state file names elsewhere). A user's file of a leftover-like name in
train_dir (`checkpoint.tmp-<hex>`, `x.tmp<hex>`, `*.tempstate7`,
`export-5_temp/`) is never deleted: towerlib's temporaries are all made
inside `.saving`.

A step that already has a complete checkpoint is never rewritten (the
restarted chief does not re-save what it restored); files of an incomplete
checkpoint at the same step are deleted, index first, before a new save.

On restore, `find_restorable_checkpoint` takes the newest checkpoint whose
index parses, whose data shards all exist and whose tensors all read back
with matching checksums, falling back to older ones with a warning; a
complete checkpoint that a kill kept out of the state file is found by
scanning the directory. Remote file systems (gs://, s3://) keep the same
order of operations but have no fsync and may not rename atomically.
"""

import logging
import os
import re
import stat

import tensorflow as tf

from towerlib.run import durable_files, folder_lock, run_entries
from towerlib.run.checkpoint_state import (
    DEFAULT_BASENAME,
    JOURNAL_FILENAME,
    SAVING_DIRNAME,
    STATE_FILENAME,
    CheckpointError,
    checkpoint_files,
    checkpoint_problem,
    checkpoint_step,
    claim_staging,
    data_shard_prefix,
    delete_checkpoint,
    read_state,
    scan_prefixes,
    staged_name,
    write_state,
)

logger = logging.getLogger("towerlib")

__all__ = [
    "DEFAULT_BASENAME", "SAVING_DIRNAME", "STATE_FILENAME", "CheckpointError",
    "CheckpointWriter", "checkpoint_files", "checkpoint_problem", "checkpoint_step",
    "JOURNAL_FILENAME", "data_shard_prefix", "delete_checkpoint", "find_restorable_checkpoint", "prepare_restore", "read_state",
    "restorable_steps",
    "remove_leftovers", "scan_prefixes", "write_state",
]


# --- finding what to restore ---


def _newest_first(listed, scanned):
    """Candidates ordered by global step, newest first; the state's order breaks ties."""
    order = {}
    for position, prefix in enumerate(listed + [p for p in scanned if p not in listed]):
        order.setdefault(prefix, position)

    def key(prefix):
        step = checkpoint_step(prefix)
        return (step if step is not None else -1, order[prefix])

    return sorted(order, key=key, reverse=True)


_JOURNAL_ENTRY = re.compile(r"^([^/\t]+-\d+)\.(index|meta|data-\d{5}-of-\d{5})\t(\d+)$")


def _journaled_files(train_dir):
    """The recorded files of the checkpoints an interrupted save was publishing or
    deleting, as [(prefix, path)], each still the very file recorded (its inode);
    a line of any other form (a journal towerlib did not write) is ignored."""
    path = os.path.join(train_dir, SAVING_DIRNAME, JOURNAL_FILENAME)
    if not run_entries.is_regular_file(path):
        run_entries.check_file(path)  # a FIFO, a folder, a link: refused, never opened
        return []
    if durable_files.is_local(path):
        fd = run_entries.open_regular(path)
        with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    else:
        with tf.io.gfile.GFile(path) as handle:
            lines = handle.read().splitlines()
    found, ignored = [], []
    for line in lines:
        entry = _JOURNAL_ENTRY.match(line)
        if entry is None:
            ignored += [line] if line.strip() else []
            continue
        name, inode = line.split("\t")[0], int(entry.group(3))
        file_path = os.path.join(train_dir, name)
        if not durable_files.is_local(file_path):
            found.append((os.path.join(train_dir, entry.group(1)), file_path))
            continue
        info = os.lstat(file_path) if os.path.lexists(file_path) else None
        if info is not None and stat.S_ISREG(info.st_mode) and info.st_ino == inode:
            found.append((os.path.join(train_dir, entry.group(1)), file_path))
    if ignored:
        logger.warning("Ignoring %d line(s) of %s that towerlib's writer does not write "
                       "(e.g. %r): no file they name is deleted.", len(ignored), path,
                       ignored[0][:80])
    return found


def _journal_lines(prefixes):
    """'<file name>\\t<inode>' of every file of `prefixes` (0 where there are no inodes)."""
    lines = []
    for prefix in prefixes:
        for path in checkpoint_files(prefix):
            inode = os.lstat(path).st_ino if durable_files.is_local(path) else 0
            lines.append(f"{os.path.basename(path)}\t{inode}\n")
    return lines


def remove_leftovers(train_dir):
    """Deletes what killed writers of towerlib left behind; returns the paths removed.

    Only what towerlib wrote: the `.saving` staging folder (when every entry
    in it has a name towerlib's writer gives; anything else makes it a user's
    folder, refused with run_entries.ControlEntryError before anything is
    deleted), and the files the journal in it recorded (name and inode) of a
    checkpoint whose `.index` is missing. Nothing else in train_dir, whatever
    its name. Only the chief, the one writer, may call this. A control entry
    that is a link, a FIFO or a folder where a file belongs is refused.
    """
    removed = []
    if not tf.io.gfile.isdir(train_dir):
        return removed
    folder_lock.refuse_linked_entries(train_dir)
    staging = os.path.join(train_dir, SAVING_DIRNAME)
    if not tf.io.gfile.exists(staging):
        return removed
    claim_staging(train_dir)  # checks it, before anything is deleted
    for prefix, path in _journaled_files(train_dir):
        if not tf.io.gfile.exists(prefix + ".index"):
            durable_files.remove_file(path)
            removed.append(path)
    interrupted = bool(tf.io.gfile.listdir(staging))  # empty after a good save
    tf.io.gfile.rmtree(staging)
    if interrupted:
        removed.append(staging)
    if removed:
        durable_files.fsync_dir(train_dir)
    return removed


def find_restorable_checkpoint(train_dir, read_values=True):
    """The newest checkpoint in `train_dir` that restores completely, or None.

    Candidates are those the state file lists and every '*.index' in the
    directory (a kill between publishing a checkpoint and updating the state
    leaves a complete checkpoint the state does not list yet). They are tried
    newest global step first; each one skipped is logged as a warning with
    the reason.

    Raises:
      CheckpointError: checkpoints exist but none can be restored (restarting
        from scratch silently would throw away the run).
    """
    if not tf.io.gfile.isdir(train_dir):
        return None
    listed = read_state(train_dir)
    candidates = _newest_first(listed, scan_prefixes(train_dir))
    problems = []
    for prefix in candidates:
        problem = checkpoint_problem(prefix, read_values=read_values)
        if problem is None:
            for skipped, reason in problems:
                logger.warning("Not restoring checkpoint %s: %s. Falling back to %s.",
                               skipped, reason, prefix)
            return prefix
        problems.append((prefix, problem))
    if problems:
        listing = "\n".join(f"  {prefix}: {reason}" for prefix, reason in problems)
        raise CheckpointError(
            f"No checkpoint in {train_dir} can be restored:\n{listing}\n"
            "Restore the directory from a backup, or move these files away to "
            "start training from scratch.")
    return None


def restorable_steps(train_dir):
    """{global step: prefix} of the complete checkpoints in `train_dir`.

    Complete means every file is there (values are not read): what workers
    that must restore the same step compare (towerlib.cluster.allreduce_job).
    """
    if not tf.io.gfile.isdir(train_dir):
        return {}
    steps = {}
    for prefix in _newest_first(read_state(train_dir), scan_prefixes(train_dir)):
        step = checkpoint_step(prefix)
        if step is not None and step not in steps and \
                checkpoint_problem(prefix, read_values=False) is None:
            steps[step] = prefix
    return steps


def prepare_restore(train_dir, read_values=True):
    """Chooses the checkpoint a (chief) restart restores, and tidies train_dir.

    Removes leftovers of killed writers, picks the newest restorable
    checkpoint, and rewrites the state file when it did not name that one
    (so that evaluation jobs and `tf.train.latest_checkpoint` agree).

    Returns:
      The prefix to restore, or None to start from scratch.
    """
    for path in remove_leftovers(train_dir):
        logger.info("Removed leftover of an interrupted save: %s", path)
    prefix = find_restorable_checkpoint(train_dir, read_values=read_values)
    if prefix is None:
        logger.info("No checkpoint in %s: training starts from scratch.", train_dir)
        return None
    listed = read_state(train_dir)
    if not listed or listed[-1] != prefix:
        kept = [p for p in listed if checkpoint_step(p) is None
                or checkpoint_step(p) < (checkpoint_step(prefix) or 0)]
        kept = [p for p in kept if checkpoint_problem(p, read_values=False) is None]
        write_state(train_dir, kept + [prefix])
        logger.warning("The state file of %s did not name %s as the latest complete "
                       "checkpoint; rewrote it.", train_dir, prefix)
    logger.info("Restoring %s (global step %s).", prefix, checkpoint_step(prefix))
    return prefix


# --- writing ---


def _remove_staged_files(train_dir):
    """Removes what a failed save staged in train_dir/.saving (and the folder, if that
    leaves it empty); nothing of anyone else's."""
    staging = os.path.join(train_dir, SAVING_DIRNAME)
    if not tf.io.gfile.exists(staging) or os.path.islink(staging):
        return
    for name in tf.io.gfile.listdir(staging):
        path = os.path.join(staging, name.rstrip("/"))
        if staged_name(name.rstrip("/")) and not os.path.islink(path):
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                durable_files.remove_file(path)
    if not tf.io.gfile.listdir(staging):
        tf.io.gfile.rmtree(staging)


class CheckpointWriter:
    """Saves checkpoints so that a kill at any moment leaves the last one intact.

    See the module docstring for the order of operations. One writer per
    train_dir (the chief's).
    """

    def __init__(self, saver, train_dir, *, basename=DEFAULT_BASENAME,
                 max_to_keep=5, write_meta_graph=True):
        """
        Args:
          saver: a tf.compat.v1.train.Saver (e.g. the Scaffold's); only its
            `save(..., write_state=False)` is used.
          train_dir: the directory checkpoints are published in.
          basename: file name stem; checkpoints are '<basename>-<global step>'.
          max_to_keep: how many of the newest checkpoints to keep (>= 1).
          write_meta_graph: also write '<prefix>.meta' (for import_meta_graph).
        """
        if max_to_keep is None or max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}.")
        self.saver = saver
        self.train_dir = str(train_dir)
        self.basename = basename
        self.max_to_keep = max_to_keep
        self.write_meta_graph = write_meta_graph
        tf.io.gfile.makedirs(self.train_dir)
        # read_state leaves out what is not in this folder: never pruned here.
        self.kept = [p for p in read_state(self.train_dir)
                     if checkpoint_problem(p, read_values=False) is None]

    def prefix_for(self, step):
        return os.path.join(self.train_dir, f"{self.basename}-{int(step)}")

    @property
    def latest(self):
        return self.kept[-1] if self.kept else None

    def save(self, session, step, replace=False):
        """Saves the session's variables as '<basename>-<step>'; returns the prefix.

        A no-op (returning the existing prefix) when that step already has a
        complete checkpoint listed in the state (the variables are the ones
        restored from it), unless `replace`: then saved over it.
        """
        final = self.prefix_for(step)
        if final in self.kept and not replace:
            return final
        logger.info("Saving checkpoint for step %d to %s.", step, final)
        try:
            staged = self._stage(session, step)
        except BaseException as error:
            # A full disk, say: the partial files go now, not at the next start.
            _remove_staged_files(self.train_dir)
            reason = run_entries.disk_full_reason(error)
            if reason:
                raise run_entries.DiskFullError(
                    f"Saving the checkpoint of step {int(step)} in {self.train_dir} failed: "
                    f"{reason}. Fix: free space on that disk (or give a "
                    f"train_dir on another), then rerun: "
                    + (f"it resumes from {self.latest}, which is intact." if self.latest
                       else "no checkpoint was written yet, so it starts over.")) from None
            raise
        kept = [p for p in self.kept if p != final] + [final]
        self._journal(staged, final, kept[:-self.max_to_keep])
        self._publish(staged, final)
        self._update_state(final)
        durable_files.remove_file(os.path.join(self.train_dir, SAVING_DIRNAME,
                                               JOURNAL_FILENAME))
        return final

    def _journal(self, staged, final, dropped):
        """Records (in .saving) each file about to be published or deleted with its
        inode (a rename keeps it), so that a restart after a kill removes those very
        files and nothing else."""
        del final  # the staged files keep their names (and inodes) when published
        lines = _journal_lines([staged]) + _journal_lines(dropped)
        staging = os.path.join(self.train_dir, SAVING_DIRNAME)
        durable_files.atomic_write_text(os.path.join(staging, JOURNAL_FILENAME),
                                        "".join(lines), temporary_dir=staging)

    def _stage(self, session, step):
        folder_lock.refuse_linked_entries(self.train_dir)   # a link made during the run
        staging = claim_staging(self.train_dir)
        staged = os.path.join(staging, f"{self.basename}-{int(step)}")
        delete_checkpoint(staged)
        # Saver.save takes the eager path outside a graph context.
        with session.graph.as_default():
            self.saver.save(session, staged, write_state=False,
                            write_meta_graph=self.write_meta_graph)
        for path in checkpoint_files(staged):
            durable_files.fsync_file(path)
        return staged

    def _publish(self, staged, final):
        """Moves the staged files into train_dir, the index last."""
        if checkpoint_files(final):
            logger.warning("Deleting the %s checkpoint %s before saving over it.",
                           "earlier" if final in self.kept else "incomplete", final)
            delete_checkpoint(final)
        files = checkpoint_files(staged)
        if not files or not files[-1].endswith(".index"):
            raise CheckpointError(
                f"Saving {final} produced no index file in {os.path.dirname(staged)} "
                f"(files: {files}); the checkpoint was not published.")
        for path in files[:-1]:
            durable_files.rename(path, final + path[len(staged):])
        durable_files.fsync_dir(self.train_dir)
        durable_files.rename(files[-1], final + ".index")
        durable_files.fsync_dir(self.train_dir)

    def _update_state(self, final):
        kept = [p for p in self.kept if p != final] + [final]
        dropped, kept = kept[:-self.max_to_keep], kept[-self.max_to_keep:]
        write_state(self.train_dir, kept)
        self.kept = kept
        for prefix in dropped:
            delete_checkpoint(prefix)
