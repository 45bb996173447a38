"""Failures of a training run that the user can act on, as one line with the fix.

towerlib's errors are written for a program: several lines, or TensorFlow's whole trace
(a full disk during a save is a 144-line ResourceExhaustedError). The scripts print one
line and exit with status 2 (script_runner), so each failure is restated here with what
the user needs: the folder, the checkpoint that training resumes from, and the fix.
"""

import contextlib
import errno
from typing import Optional

import tensorflow as tf

import towerlib
from towerlib.run import sessions


class RunError(RuntimeError):
    """A training run stopped for a reason the user can fix; one line, with the fix."""


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).strip().splitlines() if line.strip())


def restorable_checkpoint(train_dir: str) -> Optional[str]:
    """The checkpoint a (re)start of train_dir restores, as towerlib chooses it: the
    newest that reads back completely (a torn newer one is skipped with a warning), or
    None. Eval, export and the train script all ask this, never the state file alone.

    Raises:
      RunError: checkpoints exist but none can be restored.
    """
    try:
        return towerlib.find_restorable_checkpoint(train_dir)
    except towerlib.CheckpointError as e:
        raise RunError(_one_line(e)) from None


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, towerlib.DiskFullError):   # towerlib's save said it
        return True
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(error, tf.errors.ResourceExhaustedError):
        return "space" in str(error).lower()  # not an out-of-memory tensor
    return False


def _last_checkpoint_text(train_dir: str) -> str:
    try:
        prefix = towerlib.find_restorable_checkpoint(train_dir, read_values=False)
    except towerlib.CheckpointError:
        prefix = None
    if prefix is None:
        return "there is no complete checkpoint yet, so a rerun starts from step 0"
    return "the last complete checkpoint is %s, which a rerun resumes from" % prefix


@contextlib.contextmanager
def one_line_errors(train_dir: str):
    """Restates a full disk and a non-finite loss as a RunError naming the checkpoint
    to resume from; a folder another trainer holds, a checkpoint that does not fit and
    a session recreated too often as one line."""
    try:
        yield
    except towerlib.NonFiniteError as e:
        where = (
            "the last good checkpoint is %s" % e.last_checkpoint
            if e.last_checkpoint
            else _last_checkpoint_text(train_dir)
        )
        raise RunError(
            "The loss became NaN or Inf at step %s (%s); nothing of that step was "
            "saved, and %s. Fix: rerun the same command to resume from it, or start "
            "over with a lower --learning_rate (or --warmup_epochs) in a new --train_dir "
            "or with --overwrite_train_dir."
            % (e.step, "; ".join(e.problems), where)
        ) from None
    except towerlib.DiskFullError as e:
        raise _disk_full(train_dir, e) from None
    except (towerlib.CheckpointError, sessions.SessionRecreationError) as e:
        # Another trainer holds the folder; a checkpoint that does not fit; a session
        # that failed again and again: towerlib's first line names the fix.
        raise RunError(_one_line(e)) from None
    except (OSError, tf.errors.ResourceExhaustedError) as e:
        if not _is_disk_full(e):
            raise
        raise _disk_full(train_dir, e) from None


def _disk_full(train_dir: str, error: BaseException) -> RunError:
    return RunError(
        "No space left on the device of --train_dir=%r (%s); %s. Fix: free space "
        "there (or use another --train_dir) and rerun the same command."
        % (train_dir, _one_line(getattr(error, "message", None) or error)[:200],
           _last_checkpoint_text(train_dir)))
