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
import uuid

import tensorflow as tf

logger = logging.getLogger("towerlib")

STATE_FILENAME = "checkpoint"
SAVING_DIRNAME = ".saving"
DEFAULT_BASENAME = "model.ckpt"

_DATA_SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
_STEP_SUFFIX = re.compile(r"-(\d+)$")
# Temporary files TensorFlow's own writers leave behind when killed.
_TF_LEFTOVER = re.compile(r"(\.tempstate\d+$)|(\.tmp[0-9a-f]{32}$)|(-\d+_temp(_[0-9a-f]+)?$)")


class CheckpointError(RuntimeError):
    """No checkpoint in train_dir can be restored, though some were written."""


# --- file operations (module level so that fault-injection tests can wrap them) ---


def _is_local(path):
    return "://" not in str(path)


def _fsync_file(path):
    if not _is_local(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path):
    """Makes renames and deletions in `path` durable (POSIX; a no-op elsewhere)."""
    if not _is_local(path) or not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename(source, target):
    """Atomically replaces `target` by `source` (same directory tree)."""
    if _is_local(source):
        os.replace(source, target)
    else:
        tf.io.gfile.rename(source, target, overwrite=True)


def _remove_file(path):
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def atomic_write_text(path, text):
    """Writes `text` to `path` so that readers see the old file or the new one.

    The text goes to a temporary file in the same directory, which is fsynced
    and then renamed over `path`; the directory is fsynced after the rename.
    """
    directory = os.path.dirname(path) or "."
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    if _is_local(path):
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    else:
        with tf.io.gfile.GFile(temporary, "w") as handle:
            handle.write(text)
    try:
        _rename(temporary, path)
    except BaseException:
        _remove_file(temporary)
        raise
    _fsync_dir(directory)


# --- naming ---


def checkpoint_step(prefix):
    """The global step in a prefix like '.../model.ckpt-1200', or None."""
    match = _STEP_SUFFIX.search(str(prefix))
    return int(match.group(1)) if match else None


def _data_shards(prefix):
    return sorted(tf.io.gfile.glob(f"{_glob_escape(prefix)}.data-?????-of-?????"))


def _glob_escape(path):
    return re.sub(r"([*?\[])", r"[\1]", str(path))


def checkpoint_files(prefix):
    """The files of the checkpoint at `prefix` that exist: data shards, .meta, .index.

    The index is last, the order in which a checkpoint is published and the
    reverse of the order in which it must be deleted.
    """
    files = _data_shards(prefix)
    for suffix in (".meta", ".index"):
        if tf.io.gfile.exists(prefix + suffix):
            files.append(prefix + suffix)
    return files


def delete_checkpoint(prefix):
    """Deletes a checkpoint's files, the .index first.

    Killed half-way, what remains has no index and so is never restored.
    """
    index = prefix + ".index"
    if tf.io.gfile.exists(index):
        _remove_file(index)
        _fsync_dir(os.path.dirname(prefix))
    for path in checkpoint_files(prefix):
        _remove_file(path)


# --- verification ---


def checkpoint_problem(prefix, read_values=True):
    """Why the checkpoint at `prefix` cannot be restored, or None if it can.

    Args:
      prefix: a checkpoint prefix, e.g. '/train/model.ckpt-1200'.
      read_values: also read every tensor back, which verifies each one's
        CRC32C checksum (catches truncated or corrupted data files). Costs one
        read of the checkpoint; without it only the index and the presence of
        every data shard are checked.

    Returns:
      None, or a sentence naming the file at fault.
    """
    index = prefix + ".index"
    if not tf.io.gfile.exists(index):
        return f"its index {index} is missing (the save did not finish)"
    shards = _data_shards(prefix)
    counts = {int(_DATA_SHARD.search(s).group(2)) for s in shards}
    if len(counts) > 1:
        return f"its data shards disagree on the shard count: {shards}"
    if counts:
        expected = counts.pop()
        for shard in range(expected):
            path = f"{prefix}.data-{shard:05d}-of-{expected:05d}"
            if not tf.io.gfile.exists(path):
                return f"its data shard {path} is missing"
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        names = reader.get_variable_to_shape_map()
        if names and not shards:
            return f"it has no data file ({prefix}.data-*) for its {len(names)} tensors"
        if read_values:
            for name in sorted(names):
                reader.get_tensor(name)
    except Exception as error:  # pylint: disable=broad-except
        # The reader raises OpError, ValueError, RuntimeError or IndexError
        # ("Read less bytes than requested" on a truncated data file).
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        return f"it cannot be read ({message})"
    return None


# --- the state file ---


def _absolute(train_dir, path):
    return path if os.path.isabs(path) or not _is_local(path) else os.path.join(train_dir, path)


def read_state(train_dir):
    """The checkpoint prefixes the state file lists, oldest first (absolute paths).

    An unreadable or missing state file gives [] (the directory scan in
    `find_restorable_checkpoint` still finds the checkpoints).
    """
    state = tf.train.get_checkpoint_state(train_dir)
    if state is None:
        return []
    listed = [_absolute(train_dir, p) for p in state.all_model_checkpoint_paths]
    latest = (_absolute(train_dir, state.model_checkpoint_path)
              if state.model_checkpoint_path else None)
    if latest and latest not in listed:
        listed.append(latest)
    return listed


def write_state(train_dir, prefixes):
    """Atomically writes TensorFlow's `checkpoint` state file listing `prefixes`.

    The last prefix is the latest. Paths are written relative to train_dir,
    so that the directory can be moved.
    """
    def relative(prefix):
        return os.path.relpath(prefix, train_dir) if _is_local(prefix) else prefix

    lines = []
    if prefixes:
        lines.append(f'model_checkpoint_path: "{_quote(relative(prefixes[-1]))}"')
        lines.extend(f'all_model_checkpoint_paths: "{_quote(relative(p))}"'
                     for p in prefixes)
    atomic_write_text(os.path.join(train_dir, STATE_FILENAME), "\n".join(lines) + "\n")


def _quote(text):
    return text.replace("\\", "\\\\").replace('"', '\\"')


# --- finding what to restore ---


def _scan_prefixes(train_dir):
    """Prefixes of every '<name>-<step>.index' file directly in train_dir.

    Files without a step suffix (an exported 'best.index', say) are not
    training checkpoints and are left to the state file to name.
    """
    pattern = os.path.join(_glob_escape(train_dir), "*.index")
    prefixes = [path[:-len(".index")] for path in tf.io.gfile.glob(pattern)]
    return [p for p in prefixes if checkpoint_step(p) is not None]


def _newest_first(listed, scanned):
    """Candidates ordered by global step, newest first; the state's order breaks ties."""
    order = {}
    for position, prefix in enumerate(listed + [p for p in scanned if p not in listed]):
        order.setdefault(prefix, position)

    def key(prefix):
        step = checkpoint_step(prefix)
        return (step if step is not None else -1, order[prefix])

    return sorted(order, key=key, reverse=True)


def remove_leftovers(train_dir):
    """Deletes what killed writers leave behind; returns the paths removed.

    That is: the `.saving` staging directory, TensorFlow's temporary files
    (`*.tempstate<N>`, `checkpoint.tmp<hex>`, `<prefix>_temp/`), towerlib's
    `checkpoint.tmp-<hex>`, and data shards whose index is missing (a
    checkpoint half-deleted or half-written by an old TensorFlow saver). Only
    the chief, the one writer, may call this.
    """
    removed = []
    if not tf.io.gfile.isdir(train_dir):
        return removed
    staging = os.path.join(train_dir, SAVING_DIRNAME)
    if tf.io.gfile.exists(staging):
        interrupted = bool(tf.io.gfile.listdir(staging))  # empty after a good save
        tf.io.gfile.rmtree(staging)
        if interrupted:
            removed.append(staging)
    for name in tf.io.gfile.listdir(train_dir):
        name = name.rstrip("/")
        path = os.path.join(train_dir, name)
        if _TF_LEFTOVER.search(name) or name.startswith(STATE_FILENAME + ".tmp"):
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                _remove_file(path)
            removed.append(path)
            continue
        shard = _DATA_SHARD.search(name)
        if shard and not tf.io.gfile.exists(
                os.path.join(train_dir, name[:shard.start()]) + ".index"):
            _remove_file(path)
            removed.append(path)
    if removed:
        _fsync_dir(train_dir)
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
    candidates = _newest_first(listed, _scan_prefixes(train_dir))
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
        self.kept = [p for p in read_state(self.train_dir)
                     if checkpoint_problem(p, read_values=False) is None]

    def prefix_for(self, step):
        return os.path.join(self.train_dir, f"{self.basename}-{int(step)}")

    @property
    def latest(self):
        return self.kept[-1] if self.kept else None

    def save(self, session, step):
        """Saves the session's variables as '<basename>-<step>'; returns the prefix.

        A no-op (returning the existing prefix) when that step already has a
        complete checkpoint listed in the state: the variables are the ones
        restored from it.
        """
        final = self.prefix_for(step)
        if final in self.kept:
            return final
        logger.info("Saving checkpoint for step %d to %s.", step, final)
        staged = self._stage(session, step)
        self._publish(staged, final)
        self._update_state(final)
        return final

    def _stage(self, session, step):
        staging = os.path.join(self.train_dir, SAVING_DIRNAME)
        tf.io.gfile.makedirs(staging)
        staged = os.path.join(staging, f"{self.basename}-{int(step)}")
        delete_checkpoint(staged)
        # Saver.save takes the eager path outside a graph context.
        with session.graph.as_default():
            self.saver.save(session, staged, write_state=False,
                            write_meta_graph=self.write_meta_graph)
        for path in checkpoint_files(staged):
            _fsync_file(path)
        return staged

    def _publish(self, staged, final):
        """Moves the staged files into train_dir, the index last."""
        if checkpoint_files(final):
            logger.warning("Deleting the incomplete checkpoint %s before saving over it.",
                           final)
            delete_checkpoint(final)
        files = checkpoint_files(staged)
        if not files or not files[-1].endswith(".index"):
            raise CheckpointError(
                f"Saving {final} produced no index file in {os.path.dirname(staged)} "
                f"(files: {files}); the checkpoint was not published.")
        for path in files[:-1]:
            _rename(path, final + path[len(staged):])
        _fsync_dir(self.train_dir)
        _rename(files[-1], final + ".index")
        _fsync_dir(self.train_dir)

    def _update_state(self, final):
        kept = [p for p in self.kept if p != final] + [final]
        dropped, kept = kept[:-self.max_to_keep], kept[-self.max_to_keep:]
        write_state(self.train_dir, kept)
        self.kept = kept
        for prefix in dropped:
            delete_checkpoint(prefix)


class CrashSafeSaverHook(tf.compat.v1.train.SessionRunHook):
    """Saves with a CheckpointWriter every N steps or seconds, and at the end.

    Saves once right after the session is created (unless that step already
    has a checkpoint, as after a restore), and at `end`, which
    MonitoredSession calls only when training stops without an exception:
    a step that raised (e.g. a non-finite loss) is never saved. Put this hook
    after every hook that can raise, so that a check failing in `after_run`
    stops the save of that same step.
    """

    def __init__(self, train_dir, scaffold, *, save_steps=None, save_secs=None,
                 max_to_keep=5, basename=DEFAULT_BASENAME, write_meta_graph=True):
        if (save_steps is None) == (save_secs is None):
            raise ValueError("Give exactly one of save_steps and save_secs.")
        self._train_dir = train_dir
        self._scaffold = scaffold
        self._timer = tf.compat.v1.train.SecondOrStepTimer(
            every_secs=save_secs, every_steps=save_steps)
        self._writer_options = dict(max_to_keep=max_to_keep, basename=basename,
                                    write_meta_graph=write_meta_graph)
        self._global_step = None
        self.writer = None

    @property
    def last_saved(self):
        """The prefix of the newest complete checkpoint, or None."""
        return self.writer.latest if self.writer else None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        if self._global_step is None:
            raise RuntimeError("CrashSafeSaverHook needs a global step: create it "
                               "with tf.compat.v1.train.get_or_create_global_step().")

    def after_create_session(self, session, coord):
        saver = self._scaffold.saver if self._scaffold is not None else None
        if saver is None:
            savers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
            if len(savers) != 1:
                raise RuntimeError(
                    f"Found {len(savers)} savers in the SAVERS collection; pass a "
                    "Scaffold with the saver to use.")
            saver = savers[0]
        self.writer = CheckpointWriter(saver, self._train_dir, **self._writer_options)
        step = int(session.run(self._global_step))
        self.writer.save(session, step)
        self._timer.update_last_triggered_step(step)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        # The step read before the update; +1 is the step this run produced.
        if self._timer.should_trigger_for_step(run_values.results + 1):
            step = int(run_context.session.run(self._global_step))
            if self._timer.should_trigger_for_step(step):
                self._timer.update_last_triggered_step(step)
                self.writer.save(run_context.session, step)

    def end(self, session):
        step = int(session.run(self._global_step))
        if step != self._timer.last_triggered_step():
            self.writer.save(session, step)
