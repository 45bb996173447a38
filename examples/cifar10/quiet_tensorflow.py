"""TensorFlow's C++ start-up log, kept quiet for the example's scripts.

On a machine without a GPU every TensorFlow process logs, at error level, that its call
to cuInit failed, before the script's first line: to a newcomer it reads as a failure.
TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, when it is imported, so the package sets it
here, before any of its modules imports TensorFlow. A value the user set is kept
(TF_CPP_MIN_LOG_LEVEL=0 shows everything again).

Without an NVIDIA driver the level is 3 (errors hidden too: the GPU ones are expected
there, and a real error reaches the script as a Python exception). With a driver it is 2
(warnings and information hidden), so that a GPU problem logged at error level stays in
sight.

The variable does not reach the few lines TensorFlow's libraries print as they load, twice
per process, before TensorFlow reads it ("WARNING: All log messages before
absl::InitializeLog() ...", "oneDNN custom operations are on ...", "Could not find cuda
drivers on your machine ..."). When the user set no level, the package filters those lines
out of the import (filter_startup_lines): while `import tensorflow` runs, file
descriptor 2 goes through a small filter process that drops exactly those lines and passes
every other byte on to the real stderr at once, in order. A separate process, so that even
if TensorFlow's import crashed the process, everything it printed still arrives.
TF_CPP_MIN_LOG_LEVEL set by the user (any value) turns the filter off.
"""

import importlib.abc
import importlib.util
import os
import re
import subprocess
import sys

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"
WITHOUT_GPU_DRIVER = "3"  # hides ERROR: the failed cuInit of a CPU machine
WITH_GPU_DRIVER = "2"  # hides WARNING and INFO


def quiet_level(driver_file: str = NVIDIA_DRIVER_FILE) -> str:
    """The level the scripts use when the user set none."""
    return WITH_GPU_DRIVER if os.path.exists(driver_file) else WITHOUT_GPU_DRIVER


def keep_tensorflow_quiet(environ=os.environ) -> str:
    """Sets TF_CPP_MIN_LOG_LEVEL unless it is set; returns the level in effect.

    It only works before TensorFlow is imported (the package calls it first thing).
    """
    return environ.setdefault(LEVEL_VARIABLE, quiet_level())


# The lines TensorFlow's libraries print while they load, before TF_CPP_MIN_LOG_LEVEL is
# read: absl's banner, and two INFO lines (an "I" severity) from two known source files.
STARTUP_LINE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR"
    r"|I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\."
    r"|I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your "
    r"machine, GPU will not be used\.)")

# The filter process: stdin (the import's fd 2) to stdout (the real stderr), line by line,
# without STARTUP_LINE's lines. Isolated mode (-I): no site, nothing of the user's.
_FILTER_PROGRAM = """
import re, sys
startup = re.compile(%r.encode())
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if not startup.match(line):
        out.write(line)
        out.flush()
"""


def is_startup_line(line: str) -> bool:
    """True for one of the lines TensorFlow's libraries print as they load."""
    return bool(STARTUP_LINE.match(line))


class _FilteredStderr:
    """File descriptor 2 through the filter process, until close()."""

    def __init__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._filter = subprocess.Popen(
            [sys.executable, "-I", "-c", _FILTER_PROGRAM % STARTUP_LINE.pattern],
            stdin=subprocess.PIPE, stdout=self._saved, stderr=self._saved,
            close_fds=True)
        os.dup2(self._filter.stdin.fileno(), 2)

    def close(self):
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # the real stderr back; the pipe's last writer closes
        self._filter.stdin.close()
        try:
            self._filter.wait(timeout=30)  # it writes out what is left, then ends
        except subprocess.TimeoutExpired:
            self._filter.kill()
        os.close(self._saved)


class _StartupLineFilter(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` (once) and runs its import through _FilteredStderr."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tensorflow":
            return None
        uninstall_filter()  # once; and find_spec below must not come back here
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def filtered_exec_module(module):
            try:
                stderr = _FilteredStderr()
            except OSError:  # no pipe or no process: the lines are only noise
                return exec_module(module)
            try:
                return exec_module(module)
            finally:
                stderr.close()

        spec.loader.exec_module = filtered_exec_module
        return spec


def uninstall_filter():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _StartupLineFilter)]


def filter_startup_lines(user_set_level: bool, modules=sys.modules) -> bool:
    """Makes the first `import tensorflow` drop TensorFlow's start-up lines, unless the
    user set TF_CPP_MIN_LOG_LEVEL or TensorFlow is already imported. Returns whether it
    did."""
    if user_set_level or "tensorflow" in modules:
        return False
    uninstall_filter()
    sys.meta_path.insert(0, _StartupLineFilter())
    return True
