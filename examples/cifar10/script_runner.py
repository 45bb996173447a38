"""How every script of the example runs: its arguments, its log, and how it fails.

The scripts (train, eval, export, main) take only --flags; they log INFO lines with a time
stamp; and an error the user can fix from the command line ends the script with one line
on stderr and exit status 2, not a traceback.
"""

import logging
import sys
from typing import Callable, Sequence

import tensorflow as tf

from examples.cifar10 import config as config_lib
from examples.cifar10 import data, download, run_errors
from towerlib.run import data_position

# The errors a user can fix from the command line; the scripts print them without a trace.
USER_ERRORS = (
    config_lib.ConfigError,
    data.DataError,
    download.DownloadError,
    run_errors.RunError,
    data_position.DataPositionError,
)


def configure_logging():
    """INFO lines of this example and of towerlib, with a time stamp, on stderr."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True
    )
    tf_logger = tf.get_logger()
    tf_logger.setLevel(logging.WARNING)  # TF's own INFO chatter (hooks, savers)
    tf_logger.propagate = False  # it has its own handler; do not print its lines twice


def run(argv: Sequence[str], body: Callable[[], object]) -> None:
    """Runs ``body``, the work of a script whose main got ``argv`` from absl.app.run.

    Positional arguments stop the script before anything runs (exit status 1): every
    setting is a flag. A user error from body() becomes one line on stderr and exit
    status 2; a cluster task that timed out waiting for the others, exit status 1.
    """
    if len(argv) > 1:
        raise SystemExit(
            "error: unexpected arguments %s; all settings are --flags." % argv[1:]
        )
    configure_logging()
    try:
        body()
    except USER_ERRORS as e:
        sys.stderr.write("error: %s\n" % e)
        sys.exit(2)
    except TimeoutError as e:
        sys.stderr.write("error: %s\n" % e)
        sys.exit(1)
