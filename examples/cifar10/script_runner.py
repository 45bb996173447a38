"""How every script of the example runs: its command line, its log, and how it fails.

The scripts (train, eval, export, main) take only --flags; they log INFO lines with a time
stamp; and an error the user can fix from the command line (a misspelt or malformed flag,
an argument that is no flag, a flag value that cannot work, bad data, a folder that
cannot be written) ends the script with one line on stderr and exit status 2, not a
traceback or absl's usage text.
"""

import contextlib
import logging
import re
import signal
import sys
from typing import Callable

import tensorflow as tf
from absl import app

import towerlib
from examples.cifar10 import data, download, options, run_errors
from examples.cifar10.command_line import fail, parse_flags

# The errors a user can fix from the command line; the scripts print them without a trace.
USER_ERRORS = (
    options.FlagError,
    data.DataError,
    download.DownloadError,
    run_errors.RunError,
    towerlib.DataPositionError,
    towerlib.DataError,
    towerlib.cluster.AddressError,  # a port another process holds
)
# A lost, stopped or never-started peer or ps task: restarting every task fixes it, so the
# status is the one schedulers restart on (towerlib.cluster.exits: 138). towerlib's own
# wait errors only: any other TimeoutError (a download's socket.timeout) is no lost peer.
RETRYABLE_ERRORS = (
    towerlib.cluster.ReplicaLostError,
    towerlib.cluster.PsUnavailableError,
    towerlib.cluster.PeerTimeoutError,
)

# TensorFlow's deprecation warnings for the calls the example makes on purpose, through
# towerlib's data position (make_saveable_from_iterator: the TF 1 Saver's way to save an
# iterator, which towerlib's checkpoints use) and the TF 1 SavedModel builder
# (build_tensor_info). Those two, and no other warning, are dropped.
KNOWN_DEPRECATIONS = ("make_saveable_from_iterator", "build_tensor_info")
_DEPRECATION = re.compile(r"^From .*: (%s) \(from tensorflow\.[\w.]+\) is deprecated"
                         % "|".join(KNOWN_DEPRECATIONS))


class KnownDeprecationFilter(logging.Filter):
    """Drops TensorFlow's deprecation warning for KNOWN_DEPRECATIONS' calls only."""

    def filter(self, record):
        return not (record.levelno == logging.WARNING
                    and _DEPRECATION.match(record.getMessage()))


@contextlib.contextmanager
def known_deprecations_silenced(logger=None):
    """While inside: the tf logger drops KNOWN_DEPRECATIONS' warnings (only those)."""
    logger = logger or tf.get_logger()
    known = KnownDeprecationFilter()
    logger.addFilter(known)
    try:
        yield
    finally:
        logger.removeFilter(known)


def configure_logging():
    """INFO lines of this example and of towerlib, with a time stamp, on stderr."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    tf_logger = tf.get_logger()
    tf_logger.setLevel(logging.WARNING)  # TF's own INFO chatter (hooks, savers)
    tf_logger.propagate = False  # it has its own handler; do not print its lines twice


def run(body: Callable[[], object]) -> None:
    """Runs a script's work, exiting by meaning (towerlib.cluster.exits): a user error is
    one line and status 2; a lost or never-started peer one line and status 138 (restart
    every task); training stopped by a signal 128 + the signal."""
    configure_logging()
    try:
        with known_deprecations_silenced():
            result = body()
    except RETRYABLE_ERRORS as error:
        fail(error, status=towerlib.cluster.RETRYABLE)
    except USER_ERRORS as error:
        fail(error)
    stop_signal = getattr(result, "stop_signal", None)
    if stop_signal:
        sys.stderr.write("stopped by %s at global step %s; rerun the same command to "
                         "resume.\n" % (stop_signal, result.global_step))
        sys.exit(towerlib.cluster.exits.for_signal(signal.Signals[stop_signal]))


def start(body: Callable[[], object]) -> None:
    """The script's entry point, once its flags are defined: parse, then run `body`."""
    app.run(lambda argv: run(body), flags_parser=parse_flags)
