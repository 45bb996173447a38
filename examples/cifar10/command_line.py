"""The scripts' command line, without TensorFlow: one-line errors and an early --help.

parse_flags makes a bad flag (or an argument that is no flag) one line and exit status 2.
parse_flags_before_tensorflow parses the command line from the flag tables (options.py)
before the script imports TensorFlow, which takes seconds: --help, --helpshort, --helpfull
and --helpxml answer at once, and so does a flag absl cannot parse, in one line. run_script
does that, then runs another module's main() (train.py's script is job.py's).
"""

import importlib
import re
import sys

from absl import app, flags

from examples.cifar10 import options

USAGE_STATUS = 2
# absl's help flags (and -? for --help), with or without a value (--help=true).
HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "?")


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


def asks_for_help(argv) -> bool:
    """A help flag among the arguments (up to a '--', after which absl reads no flag)."""
    for arg in argv[1:]:
        if arg == "--":
            return False
        if arg.startswith("-") and arg.lstrip("-").split("=")[0] in HELP_FLAGS:
            return True
    return False


def define_script_flags(table, defaults=None):
    """Defines the script's flags (`defaults`: {name: default} that differ from the
    table's) and lists them as the main module's own, so --help and --helpshort show
    them."""
    options.define(table)
    for name, value in (defaults or {}).items():
        flags.FLAGS.set_default(name, value)
    for _, name, _, _ in table:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


def parse_flags_before_tensorflow(module_name, table, defaults=None, argv=None):
    """In a script run as __main__: defines the script's flags and parses its command line
    before the script imports TensorFlow. A help flag prints absl's help for the script's
    flags and exits with absl's status (1, as after app.run's help); a flag absl cannot
    parse, or an argument that is no flag, is one line and exit status 2 (parse_flags),
    without the seconds TensorFlow's import takes. Otherwise the script goes on with its
    flags defined (its app.run parses them again, to the same values). In a module that is
    imported, not run, it does nothing."""
    argv = sys.argv if argv is None else argv
    if module_name != "__main__":
        return
    define_script_flags(table, defaults)
    app.define_help_flags()
    parse_flags(argv)  # exits in absl's help flag, or on a bad flag


def run_script(table, module_name, defaults=None):
    """A script whose work is another module's main(): parses the command line from the flag
    tables before TensorFlow loads (parse_flags_before_tensorflow), then imports
    `module_name` and runs its main() as every script does (script_runner.start). Exits."""
    parse_flags_before_tensorflow("__main__", table, defaults)
    from examples.cifar10 import script_runner  # TensorFlow loads here

    script_runner.start(importlib.import_module(module_name).main)
