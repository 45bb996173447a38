"""How every script of the example runs: its command line, its log, and how it fails.

The scripts (train, eval, export, main) take only --flags; they log INFO lines with a time
stamp; and an error the user can fix from the command line (a misspelt or malformed flag,
an argument that is no flag, a flag value that cannot work, bad data, a folder that
cannot be written) ends the script with one line on stderr and exit status 2, not a
traceback or absl's usage text.
"""

import logging
import re
import sys
from typing import Callable

import tensorflow as tf
from absl import app, flags

import towerlib
from examples.cifar10 import data, download, options, run_errors

# The errors a user can fix from the command line; the scripts print them without a trace.
USER_ERRORS = (
    options.FlagError,
    data.DataError,
    download.DownloadError,
    run_errors.RunError,
    towerlib.DataPositionError,
    towerlib.DataError,
    towerlib.cluster.ReplicaLostError,  # a lost worker: restart every worker
    towerlib.cluster.PsUnavailableError,
)
USAGE_STATUS = 2


def fail(message: str, status: int = USAGE_STATUS):
    """Ends the script with one line on stderr."""
    sys.stderr.write("error: %s\n" % " ".join(str(message).split()))
    sys.stderr.flush()
    sys.exit(status)


def parse_flags(argv):
    """absl's flags parser, but a bad flag or an argument that is no flag is one line and
    exit status 2 (absl prints its usage and exits with 1)."""
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as error:
        text = re.sub(r"\s+\?$", "?", str(error).strip())
        fail("%s%s See --helpshort for the flags." % (text, "" if text[-1:] in ".?" else "."))
    if len(rest) > 1:
        fail("unexpected arguments %s: every setting is a --flag (see --helpshort)."
             % " ".join(rest[1:]))
    return rest


def configure_logging():
    """INFO lines of this example and of towerlib, with a time stamp, on stderr."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    tf_logger = tf.get_logger()
    tf_logger.setLevel(logging.WARNING)  # TF's own INFO chatter (hooks, savers)
    tf_logger.propagate = False  # it has its own handler; do not print its lines twice


def run(body: Callable[[], object]) -> None:
    """Runs a script's work: a user error becomes one line and exit status 2; a cluster
    task that timed out waiting for the others, exit status 1."""
    configure_logging()
    try:
        body()
    except USER_ERRORS as error:
        fail(error)
    except TimeoutError as error:
        fail(error, status=1)


def start(body: Callable[[], object]) -> None:
    """The script's entry point, once its flags are defined: parse, then run `body`."""
    app.run(lambda argv: run(body), flags_parser=parse_flags)
