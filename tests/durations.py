"""Seconds per test module, measured: the file the xdist schedule reads, and the plugin
that rewrites it.

    TOWERLIB_RECORD_DURATIONS=tests/durations.json python -m pytest -q tests

With that variable set, the run sums each test's reported durations (setup, call and
teardown, as pytest's --durations and JUnit report them) per module and, at the end,
writes them into the file: a module that ran takes its new seconds, a module that did
not keeps its old ones. CI's whole-suite part sets it, so the committed file is the last
measured run. Without it nothing is written; tests/conftest.py only reads the file.

The file: {"about": "...", "modules": {"tests/x/test_y.py": seconds, ...}}, longest first.
"""

import json
import os

RECORD_ENV = "TOWERLIB_RECORD_DURATIONS"
DEFAULT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
ABOUT = ("Seconds per test module: the sum of its tests' setup, call and teardown durations "
         "in the last measured run of the whole suite (CI's first part, 2 cores, "
         "pytest-xdist). Written by tests/durations.py; read by tests/conftest.py to order "
         "the tests longest first.")


def read_module_secs(path=None):
    """{module path: seconds} from the durations file (default DEFAULT_FILE); {} if
    there is none.

    A file that is not the format above raises ValueError naming it: a schedule read
    from a broken file would be silently wrong.
    """
    path = path or DEFAULT_FILE
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error}). Fix: restore it from git, or "
                         f"rewrite it with {RECORD_ENV}={path}.") from error
    modules = data.get("modules") if isinstance(data, dict) else None
    if not isinstance(modules, dict) or not all(
            isinstance(secs, (int, float)) and secs >= 0 for secs in modules.values()):
        raise ValueError(f"{path}: expected {{\"modules\": {{path: seconds >= 0}}}}. Fix: "
                         f"restore it from git, or rewrite it with {RECORD_ENV}={path}.")
    return {name: float(secs) for name, secs in modules.items()}


def write_module_secs(path, measured, root=None):
    """Merges `measured` ({module: seconds}) into the file at `path`, whole or not at all.

    With `root` (the directory the module paths are relative to), a module whose file
    is gone is dropped: a renamed module does not linger in the schedule.
    """
    merged = dict(read_module_secs(path))
    merged.update(measured)
    if root is not None:
        merged = {name: secs for name, secs in merged.items()
                  if os.path.isfile(os.path.join(root, name))}
    ordered = dict(sorted(((name, round(secs, 1)) for name, secs in merged.items()),
                          key=lambda entry: (-entry[1], entry[0])))
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({"about": ABOUT, "modules": ordered}, f, indent=1)
        f.write("\n")
    os.replace(partial, path)


class DurationRecorder:
    """A pytest plugin: sums the reports' durations per module; writes them at the end.

    Registered on the controlling process only (under xdist, the workers' reports reach
    it through pytest_runtest_logreport, as they reach the terminal summary).
    """

    def __init__(self, path):
        self.path = path
        self.module_secs = {}

    def pytest_runtest_logreport(self, report):
        module = report.nodeid.split("::")[0]
        self.module_secs[module] = self.module_secs.get(module, 0.0) + report.duration

    def pytest_sessionfinish(self, session):
        if self.module_secs:
            write_module_secs(self.path, self.module_secs, root=str(session.config.rootpath))
