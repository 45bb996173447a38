"""What a checkpoint is on disk: its files, whether it is complete, the state file.

A checkpoint '<train_dir>/model.ckpt-<step>' is its data shards, its
'.index' (written last, so an index means a complete checkpoint) and an
optional '.meta'. The 'checkpoint' state file lists the kept ones in
TensorFlow's own text format, so tf.train.latest_checkpoint and TensorBoard
keep working. towerlib.run.checkpoints writes and restores; this module names,
checks and lists.

Only checkpoints directly in the run folder are the run's: a state file naming
a prefix elsewhere (by an absolute path, as TensorFlow 1's Saver writes them,
in a copied folder) is logged once and ignored, never restored from, and
never deleted. The state file itself must be a regular file (run_entries): a
FIFO there is refused before it is opened.
"""

import logging
import os
import re

import tensorflow as tf

from towerlib.run import durable_files, run_entries
from towerlib.run.run_entries import CheckpointError  # noqa: F401  (defined there, named here)

logger = logging.getLogger("towerlib")

STATE_FILENAME = "checkpoint"
SAVING_DIRNAME = ".saving"
DEFAULT_BASENAME = "model.ckpt"
JOURNAL_FILENAME = "publishing"  # in SAVING_DIRNAME: the files a save is changing

_FOREIGN_LOGGED = set()  # (train_dir, prefixes) already said: one line, not one per read
_DATA_SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
_STEP_SUFFIX = re.compile(r"-(\d+)$")

# What towerlib's writer leaves in SAVING_DIRNAME: a save's files (TensorFlow's
# temporaries and '_temp' folder included), the journal, the state's temporaries.
_STAGED = re.compile(r"^[^/]+-\d+(_temp(_[0-9a-f]+)?|\.(index|meta|data-\d{5}-of-\d{5})"
                     r"(\.tempstate\d+|\.tmp[0-9a-f]{32})?)$")
_CHECKPOINT_FILE = re.compile(r"^[^/]+-\d+\.(index|meta|data-\d{5}-of-\d{5})$")
_OWN_TEMPORARY = re.compile(r"^(checkpoint|publishing)\.tmp-[0-9a-f]{32}$")


# --- naming ---


def staged_name(name):
    """Whether `name` is one towerlib's writer gives an entry of SAVING_DIRNAME."""
    return (name == JOURNAL_FILENAME
            or bool(_STAGED.match(name) or _OWN_TEMPORARY.match(name)))


def run_folder_name(name):
    """Whether `name` is one towerlib gives an entry of a checkpoint folder it writes
    (`best/`): the state file, the staging folder, a checkpoint's files."""
    return (name in (STATE_FILENAME, SAVING_DIRNAME) or bool(_OWN_TEMPORARY.match(name))
            or bool(_CHECKPOINT_FILE.match(name)))


def claim_staging(train_dir):
    """train_dir/.saving, created when absent; refused (run_entries.ControlEntryError)
    when it is a link, a file, a FIFO or a folder holding what towerlib did not write."""
    return run_entries.claim_folder(os.path.join(str(train_dir), SAVING_DIRNAME),
                                    staged_name)


def in_run_folder(train_dir, prefix):
    """Whether the checkpoint `prefix` is directly in train_dir (links resolved)."""
    if not durable_files.is_local(prefix):
        return os.path.dirname(prefix).rstrip("/") == str(train_dir).rstrip("/")
    return os.path.realpath(os.path.dirname(prefix)) == os.path.realpath(train_dir)


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
        durable_files.remove_file(index)
        durable_files.fsync_dir(os.path.dirname(prefix))
    for path in checkpoint_files(prefix):
        durable_files.remove_file(path)


def data_shard_prefix(file_name):
    """'model.ckpt-5' for 'model.ckpt-5.data-00000-of-00001'; None for other names."""
    shard = _DATA_SHARD.search(file_name)
    return file_name[:shard.start()] if shard else None


def scan_prefixes(train_dir):
    """Prefixes of every '<name>-<step>.index' file directly in train_dir.

    Files without a step suffix (an exported 'best.index', say) are not
    training checkpoints and are left to the state file to name.
    """
    pattern = os.path.join(_glob_escape(train_dir), "*.index")
    prefixes = [path[:-len(".index")] for path in tf.io.gfile.glob(pattern)]
    return [p for p in prefixes if checkpoint_step(p) is not None]


# --- verification ---


def _read_variant(prefix, name):
    """Reads one variant tensor (CRC32C-checked) of a checkpoint; the Python
    reader cannot convert variants to NumPy, so a throwaway graph does it."""
    with tf.Graph().as_default() as graph:
        value = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name],
                                     shape_and_slices=[""], dtypes=[tf.variant])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(value[0].op)


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
    for path in checkpoint_files(prefix):  # a FIFO would block the reader forever
        if durable_files.is_local(path) and not os.path.isfile(path):
            return f"{path} is not a regular file (a FIFO or a folder?)"
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
            dtypes = reader.get_variable_to_dtype_map()
            for name in sorted(names):
                if dtypes[name] == tf.variant:
                    _read_variant(prefix, name)  # e.g. a saved input-pipeline position
                else:
                    reader.get_tensor(name)
    except Exception as error:  # pylint: disable=broad-except
        # The reader raises OpError, ValueError, RuntimeError or IndexError
        # ("Read less bytes than requested" on a truncated data file).
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        return f"it cannot be read ({message})"
    return None


# --- the state file ---


def _absolute(train_dir, path):
    return path if os.path.isabs(path) or not durable_files.is_local(path) else os.path.join(train_dir, path)


def read_state(train_dir):
    """The checkpoint prefixes the state file lists, oldest first (absolute paths).

    An unreadable or missing state file gives [] (the directory scan in
    `find_restorable_checkpoint` still finds the checkpoints), whatever bytes
    it holds: a torn write or a disk fault must not stop a restart. Prefixes
    outside train_dir are left out, with a warning. A state file that is a
    link, a FIFO or a folder raises run_entries.ControlEntryError.
    """
    run_entries.check_file(os.path.join(str(train_dir), STATE_FILENAME))
    try:
        state = tf.train.get_checkpoint_state(train_dir)
    except (ValueError, tf.errors.OpError) as error:  # UnicodeDecodeError is a ValueError
        logger.warning("Ignoring the unreadable checkpoint state file in %s (%s); "
                       "scanning the directory instead.", train_dir, error)
        return []
    if state is None:
        return []
    listed = [_absolute(train_dir, p) for p in state.all_model_checkpoint_paths]
    latest = (_absolute(train_dir, state.model_checkpoint_path)
              if state.model_checkpoint_path else None)
    if latest and latest not in listed:
        listed.append(latest)
    foreign = [p for p in listed if not in_run_folder(train_dir, p)]
    if foreign and (str(train_dir), tuple(foreign)) not in _FOREIGN_LOGGED:
        _FOREIGN_LOGGED.add((str(train_dir), tuple(foreign)))
        logger.warning(
            "The state file of %s names %s, outside that folder (a copied run folder's "
            "absolute paths?): not this run's, so towerlib neither restores nor deletes "
            "it; it uses the checkpoints in %s.", train_dir, ", ".join(foreign), train_dir)
    return [p for p in listed if p not in foreign]


def write_state(train_dir, prefixes):
    """Atomically writes TensorFlow's `checkpoint` state file listing `prefixes`.

    The last prefix is the latest. Paths are written relative to train_dir,
    so that the directory can be moved.
    """
    def relative(prefix):
        return os.path.relpath(prefix, train_dir) if durable_files.is_local(prefix) else prefix

    lines = []
    if prefixes:
        lines.append(f'model_checkpoint_path: "{_quote(relative(prefixes[-1]))}"')
        lines.extend(f'all_model_checkpoint_paths: "{_quote(relative(p))}"'
                     for p in prefixes)
    path = os.path.join(train_dir, STATE_FILENAME)
    run_entries.check_file(path)
    staging = claim_staging(train_dir) if durable_files.is_local(path) else None
    durable_files.atomic_write_text(path, "\n".join(lines) + "\n", temporary_dir=staging)


def _quote(text):
    return text.replace("\\", "\\\\").replace('"', '\\"')
