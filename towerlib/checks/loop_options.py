"""run_training's options, declared once, and validate_config's checks of them.

`LOOP_OPTIONS` declares each option (name, default, doc; the loop's options
are checked together, by the functions below): run_training's signature,
its frozen loop state and validate_config follow it. Each check adds
ConfigProblems to a collector (towerlib.checks.problems.Problems), or returns them,
instead of raising, so that every problem is listed at once.
"""

import itertools
import math
import numbers
import os
import signal
import uuid

import numpy as np
import tensorflow as tf

from towerlib.checks.declared_options import REQUIRED, Option, OptionTable
from towerlib.exchange.safety import DEFAULT_TIMEOUT_SECONDS

DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

LOOP_OPTIONS = OptionTable("run_training", [
    Option("train_dir", REQUIRED, None,
           "checkpoints and events; training resumes from the newest checkpoint here"),
    Option("max_steps", REQUIRED, None, "the global step to stop at"),
    Option("hooks", (), None, "extra SessionRunHooks, run before the checkpoint hook"),
    Option("session_config", None, None,
           "the sessions' ConfigProto; None gives CPU towers their virtual devices"),
    Option("master", "", None, "the session target (a server's, across machines)"),
    Option("is_chief", True, None, "the chief alone restores and writes"),
    Option("log_every_n_steps", 100, None, "how often to log the loss and speed"),
    Option("save_checkpoint_steps", None, None, "checkpoint every N steps (default 1000)"),
    Option("save_checkpoint_secs", None, None, "or every N seconds"),
    Option("save_summaries_steps", 100, None, "write summaries every N steps; None: never"),
    Option("examples_per_step", None, None, "the global batch size, for examples/sec"),
    Option("scaffold", None, None, "a tf.compat.v1.train.Scaffold (its own saver)"),
    Option("max_checkpoints_to_keep", 5, None, "how many of the newest checkpoints to keep"),
    Option("stop_on_signals", DEFAULT_SIGNALS, None,
           "signals that stop training cleanly, with a final checkpoint"),
    Option("collective_timeout_secs", DEFAULT_TIMEOUT_SECONDS, None,
           "one step's deadline when the graph has collectives"),
    Option("session_creator_wrapper", None, None, "wraps run_training's SessionCreator"),
    Option("trace_steps", (), None, "global steps to run with full tracing"),
    Option("restore_from", "newest", None, "'newest', a checkpoint prefix, or None"),
    Option("evaluation", None, None, "a towerlib.Evaluation: evaluate, keep the best, stop"),
    Option("warm_start_from", None, None,
           "a fresh run's weights from a checkpoint or Keras file (towerlib.WarmStart)"),
])


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _nearest_existing(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_train_dir(check, train_dir, probe_writes):
    if train_dir is None:
        return
    if not isinstance(train_dir, (str, os.PathLike)) or not str(train_dir):
        check.add("train_dir", f"must be a non-empty path, got {train_dir!r}.",
                  "give a directory for checkpoints and summaries.")
        return
    train_dir = os.fspath(train_dir)
    if train_dir.startswith("~"):
        check.add("train_dir", f"{train_dir!r} starts with '~', which only a shell "
                  "expands: it would create a folder named '~' here.",
                  f"pass os.path.expanduser({train_dir!r}).")
        return
    if "://" in train_dir:
        return  # remote file system: writability shows at the first save
    if os.path.exists(train_dir) and not os.path.isdir(train_dir):
        check.add("train_dir", f"{train_dir} exists and is not a directory.",
                  "pass a directory path, or move the file away.")
        return
    existing = _nearest_existing(train_dir)
    if not os.path.isdir(existing):
        check.add("train_dir", f"{train_dir} cannot be created: {existing} is a file.",
                  "choose a path whose parents are directories.")
        return
    if not probe_writes:
        return
    # Permission bits do not tell (root, read-only mounts, full disks): try.
    # The probe's name is new and towerlib's: it goes however the write ends (a full
    # disk creates the file, then fails to write it).
    probe = os.path.join(existing, f".towerlib-write-test-{uuid.uuid4().hex}")
    try:
        if existing != os.path.abspath(train_dir):
            os.mkdir(probe)
        else:
            with open(probe, "x", encoding="utf-8") as handle:
                handle.write("ok")
                handle.flush()
                os.fsync(handle.fileno())
    except OSError as error:
        what = ("is not writable" if existing == os.path.abspath(train_dir)
                else f"cannot be created: {existing} is not writable")
        check.add("train_dir", f"{train_dir} {what} ({error.strerror}).",
                  "choose a writable location, or fix its permissions or free space.")
    finally:
        _remove_probe(probe)


def _remove_probe(probe):
    try:
        if os.path.isdir(probe) and not os.path.islink(probe):
            os.rmdir(probe)
        elif os.path.lexists(probe):
            os.remove(probe)
    except OSError:
        pass   # it could not be created, or the folder is read-only


def check_training_loop(check, max_steps, save_checkpoint_steps, save_checkpoint_secs,
                         save_summaries_steps, log_every_n_steps, max_checkpoints_to_keep,
                         master, is_chief):
    if max_steps is not None and (not _is_int(max_steps) or max_steps < 0):
        check.add("max_steps", f"must be an int >= 0, got {max_steps!r}.",
                  "give the global step to stop at (not a count of new steps).")
    if save_checkpoint_steps is not None and save_checkpoint_secs is not None:
        check.add("save_checkpoint_steps/save_checkpoint_secs",
                  f"both are set ({save_checkpoint_steps} steps, "
                  f"{save_checkpoint_secs} secs).",
                  "give only one of them.")
    check.positive_int("save_checkpoint_steps", save_checkpoint_steps,
                       "checkpoint every N >= 1 steps (a final one is always written).")
    if save_checkpoint_secs is not None and (
            not _is_number(save_checkpoint_secs) or not save_checkpoint_secs > 0
            or not math.isfinite(save_checkpoint_secs)):
        check.add("save_checkpoint_secs",
                  f"must be a positive number of seconds, got {save_checkpoint_secs!r}.",
                  "e.g. 600 for every ten minutes.")
    check.positive_int("save_summaries_steps", save_summaries_steps,
                       "write summaries every N >= 1 steps, or pass None for none.")
    check.positive_int("log_every_n_steps", log_every_n_steps,
                       "log every N >= 1 steps.")
    if max_checkpoints_to_keep is None:  # TensorFlow's Saver reads None as "keep all"
        check.add("max_checkpoints_to_keep", "must be an int >= 1, got None.",
                  "keep at least the newest checkpoint (1), e.g. 5.")
    check.positive_int("max_checkpoints_to_keep", max_checkpoints_to_keep,
                       "keep at least the newest checkpoint (1), e.g. 5.")
    if not isinstance(master, (str, bytes)):
        check.add("master", f"must be a session target string, got {master!r}.",
                  "'' for a session of this process, or 'grpc://host:port' of a server.")
    if not isinstance(is_chief, (bool, np.bool_)):  # "False" would be true
        check.add("is_chief", f"is {is_chief!r}, not True or False.",
                  "is_chief=True (this process restores and writes) or False.")
    elif not is_chief and not master:
        check.add("is_chief", "is False but master is empty (a local session).",
                  "a non-chief worker waits for a chief on a cluster: pass master="
                  "'grpc://...' of this worker, or is_chief=True for local training.")


def check_session_parts(check, scaffold, session_creator_wrapper):
    """scaffold: None or a Scaffold; session_creator_wrapper: None or a callable."""
    if scaffold is not None and not isinstance(scaffold, tf.compat.v1.train.Scaffold):
        check.add("scaffold", f"must be a tf.compat.v1.train.Scaffold or None, got "
                  f"{scaffold!r}.", "e.g. scaffold=tf.compat.v1.train.Scaffold("
                  "saver=...), or leave it out.")
    if session_creator_wrapper is not None and not callable(session_creator_wrapper):
        check.add("session_creator_wrapper", f"must be a function of run_training's "
                  f"SessionCreator, got {session_creator_wrapper!r}.",
                  "e.g. session_creator_wrapper=lambda creator: MyCreator(creator), "
                  "returning a tf.compat.v1.train.SessionCreator.")


def check_restore_from(check, restore_from):
    """restore_from: 'newest', a checkpoint prefix (a path) or None."""
    if restore_from is not None and not isinstance(restore_from, (str, os.PathLike)):
        check.add("restore_from", f"must be 'newest', a checkpoint prefix or None, got "
                  f"{restore_from!r}.", "e.g. restore_from='/runs/a/model.ckpt-100'.")


MAX_TRACE_STEPS = 1000  # each traced step writes a trace and a picture


def bounded_trace_steps(trace_steps):
    """trace_steps as a tuple of at most MAX_TRACE_STEPS + 1 items (an unbounded
    iterable is never iterated further); None as (); anything that is no collection
    of steps (an int, a string) unchanged, for check_trace_steps to name."""
    if trace_steps is None:
        return ()
    if isinstance(trace_steps, (str, bytes)) or not hasattr(trace_steps, "__iter__"):
        return trace_steps
    return tuple(itertools.islice(trace_steps, MAX_TRACE_STEPS + 1))


def check_trace_steps(check, trace_steps, max_steps=None):
    """trace_steps: at most MAX_TRACE_STEPS global steps >= 1 (and <= max_steps), as an
    iterable of ints; an unbounded iterable is refused after MAX_TRACE_STEPS + 1 items."""
    if _is_int(trace_steps):
        check.add("trace_steps", f"is one int ({trace_steps}), not a collection of steps.",
                  f"trace_steps=[{max(trace_steps, 1)}] to trace that global step, or () "
                  "for none.")
        return
    steps = bounded_trace_steps(trace_steps)
    if isinstance(steps, tuple) and len(steps) > MAX_TRACE_STEPS:
        check.add("trace_steps", f"has more than {MAX_TRACE_STEPS} steps (or is unbounded, "
                  "e.g. itertools.count); each traced step writes a trace and a picture.",
                  "list the few steps to trace, e.g. trace_steps=range(20, 25).")
        return
    if not isinstance(steps, tuple) or not all(_is_int(s) and s >= 1 for s in steps):
        shown = list(steps) if isinstance(steps, tuple) else trace_steps
        check.add("trace_steps", f"must be global steps >= 1, got {shown!r}.",
                  "e.g. trace_steps=[20, 21] (a step early in the run is still warming up).")
        return
    past = sorted(s for s in steps if _is_int(max_steps) and s > max_steps)
    if past:
        check.add("trace_steps", f"steps {', '.join(map(str, past))} are past "
                  f"max_steps={max_steps}: they would never run, and trace nothing.",
                  f"trace steps up to {max_steps}, or raise max_steps.")


def loop_argument_problems(hooks, stop_on_signals, collective_timeout_secs):
    """[(option, problem, fix)] for run_training's arguments of the wrong type.

    Checked before anything reads them: a number for a hook or a name for a signal
    failed deep in TensorFlow or in Python's signal module (validate_config judges
    session_config).
    """
    problems = []
    listed = hooks if isinstance(hooks, (list, tuple)) else None
    if listed is None or not all(isinstance(h, tf.compat.v1.train.SessionRunHook)
                                 for h in listed):
        problems.append(("hooks", f"must be a list of tf.compat.v1.train.SessionRunHook, "
                         f"got {hooks!r:.80}.", "pass e.g. hooks=[my_hook]."))
    signals = stop_on_signals if isinstance(stop_on_signals, (list, tuple)) else None
    if signals is None or not all(isinstance(s, numbers.Integral) and not isinstance(
            s, bool) for s in signals):
        problems.append(("stop_on_signals", f"must be a tuple of signal numbers, got "
                         f"{stop_on_signals!r:.80}.",
                         "pass e.g. (signal.SIGINT, signal.SIGTERM), or () for none."))
    else:
        problems += _uncatchable_signals(signals)
    if isinstance(collective_timeout_secs, bool) or not isinstance(
            collective_timeout_secs, numbers.Real) or not collective_timeout_secs > 0 \
            or collective_timeout_secs == float("inf"):
        problems.append(("collective_timeout_secs", f"is {collective_timeout_secs!r}; a "
                         "step waiting for a tower is bounded by it.",
                         "give a finite number of seconds > 0, above the slowest step."))
    return problems


def _uncatchable_signals(signals):
    """SIGKILL, SIGSTOP and numbers that are no signal: no handler can be installed."""
    valid = signal.valid_signals()
    wrong = [s for s in signals if s not in valid or s in (signal.SIGKILL, signal.SIGSTOP)]
    if not wrong:
        return []
    names = ", ".join(signal.Signals(s).name if s in valid else str(s) for s in wrong)
    return [("stop_on_signals", f"holds {names}, which no process can catch (SIGKILL and "
             "SIGSTOP act in the kernel; other numbers are no signal), so nothing could "
             "save first.", "pass catchable signals, e.g. (signal.SIGINT, signal.SIGTERM).")]
