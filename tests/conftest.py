"""Fixtures shared by the test modules: the processes a test starts, always stopped;
the order in which pytest-xdist's workers get the tests (the longest first); and
TensorFlow's import without the garbage collector in every test process.

Here rather than in the repository's conftest.py, which sets up what every
run needs (quiet TensorFlow, the repository importable): these fixtures are
for tests only, next to tests/helpers.py, and load only when tests are collected.
"""

import gc
import importlib.util
import os
import uuid

import pytest

from tests import distributed_processes, durations, machine_share
from tests.distributed_processes import ProcessGroup
from tests.fault_scripts.runner import ProcessPool

# TensorFlow's import with the garbage collector paused, then its objects frozen (see
# tests/process_site/sitecustomize.py): in this process, and, through PYTHONPATH, in every
# Python process a test starts. Loaded by path: the folder is no package.
PROCESS_SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_site")
if PROCESS_SITE_DIR not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [PROCESS_SITE_DIR, os.environ.get("PYTHONPATH")]))
_spec = importlib.util.spec_from_file_location(
    "tests_process_site", os.path.join(PROCESS_SITE_DIR, "sitecustomize.py"))
_process_site = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_process_site)  # installs the finder, unless one is there


def pytest_collection_finish(session):
    """The test modules and what they imported, frozen as TensorFlow was: the full
    collections during the tests walk only what the tests make."""
    gc.collect()
    gc.freeze()


def pytest_configure(config):
    """With TOWERLIB_RECORD_DURATIONS=<file>, the run records its modules' seconds there
    (tests/durations.py); only in the controlling process, which sees every report."""
    path = os.environ.get(durations.RECORD_ENV)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(durations.DurationRecorder(path), "towerlib-durations")
    # The run's id, which xdist hands its workers (PYTEST_XDIST_TESTRUNUID), chosen here so
    # that the controller knows the machine_share files to remove at the end.
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", 0) is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session):
    """The controlling process removes the run's machine_share lock files."""
    run_id = getattr(session.config.option, "testrunuid", None)
    if run_id and not hasattr(session.config, "workerinput"):
        machine_share.remove_files(run_id)


@pytest.fixture(autouse=True)
def ports_held_for_the_test():
    """The ports a test held for its cluster processes are released after it."""
    yield
    distributed_processes.release_held_ports()


@pytest.fixture(autouse=True)
def machine_share_of_the_test(request):
    """Under xdist: a test marked one_ray_cluster has the machine to itself, the others
    share it (tests/machine_share.py). Without xdist, nothing."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run_id or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    exclusive = request.node.get_closest_marker(RAY_UNIT) is not None
    with machine_share.machine(exclusive, run_id):
        yield


@pytest.fixture
def pool():
    """Training processes of tests/fault_scripts; whatever still runs is killed after the test."""
    processes = ProcessPool()
    yield processes
    processes.close()


@pytest.fixture
def processes(tmp_path, request):
    """The cluster processes of one test, logging to tmp_path; all killed after the test.

    The test module bounds them with PROCESS_BUDGET_SECS (wall-clock seconds for
    every process of a test) and may name the program they run with
    PROCESS_COMMAND (default: examples/distributed/train.py).
    """
    options = {"budget_secs": request.module.PROCESS_BUDGET_SECS}
    command = getattr(request.module, "PROCESS_COMMAND", None)
    if command is not None:
        options["command"] = command
    group = ProcessGroup(tmp_path, **options)
    try:
        yield group
    finally:
        group.close()


# --- the order of the tests, for pytest-xdist's worksteal scheduler ---------------------------
#
# worksteal hands worker k the k-th contiguous slice of the collected tests (equal counts)
# and later moves tests from the back of a busy worker's queue to an idle one. In the
# collected (alphabetical) order one slice held most of the long tests, which then ran one
# after another at the end of the run while the other core was idle. So each slice is made
# to hold about the same seconds of tests, with its longest modules first: what is stolen
# at the end is short. A module stays in one piece (its module-scoped fixtures, such as a
# trained run folder, are built once). Seconds of each module: measured, in
# tests/durations.json (tests/durations.py; CI's whole-suite part rewrites it). A module not
# in it counts SLOW_TEST_SECS per test marked slow and FAST_TEST_SECS per other test.
SLOW_TEST_SECS = 5.0
FAST_TEST_SECS = 0.25


def _module_secs(path, module_items, module_secs):
    if path in module_secs:
        return module_secs[path]
    slow = sum(1 for item in module_items if item.get_closest_marker("slow"))
    return SLOW_TEST_SECS * slow + FAST_TEST_SECS * (len(module_items) - slow)


def balanced_order(modules, workers):
    """`modules`: [(seconds, [item, ...]), ...] in collection order. Returns the items in
    `workers` consecutive slices of the sizes worksteal gives its workers at the start,
    each with about the same seconds and its longest modules first."""
    total = sum(len(items) for _, items in modules)
    sizes = []
    for k in range(workers):  # xdist's first split: len(pending) // workers_remaining
        sizes.append((total - sum(sizes)) // (workers - k))
    slices = [dict(secs=0.0, room=size, parts=[]) for size in sizes]
    # Longest first, each to the slice with the fewest seconds that has room for it whole;
    # a module too large for every slice's room (short tests only, in practice) is split.
    for secs, items in sorted(modules, key=lambda module: -module[0]):
        while items:
            fits = [s for s in slices if s["room"] >= len(items)]
            target = min(fits or [s for s in slices if s["room"]], key=lambda s: s["secs"])
            part, items = items[:target["room"]], items[target["room"]:]
            share = secs * len(part) / (len(part) + len(items))
            secs -= share
            target["parts"].append((share, part))
            target["secs"] += share
            target["room"] -= len(part)
    ordered = []
    for target in slices:
        for _, part in sorted(target["parts"], key=lambda p: -p[0]):  # stable: ties keep order
            ordered.extend(part)
    return ordered


# Modules whose tests start a local Ray cluster (marker one_ray_cluster) are one unit of
# the schedule: one worker runs them one after the other. Two clusters at once starve each
# other on 2 cores, and a test waiting for the other's cluster (tests/cluster/ray_serial.py,
# kept as the guard) would hold its worker idle.
RAY_UNIT = "one_ray_cluster"


def pytest_collection_modifyitems(config, items):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or len(items) < workers:
        return  # one process runs the tests in the order collected
    by_module = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::")[0], []).append(item)
    module_secs = durations.read_module_secs()
    units = {}
    for path, module_items in by_module.items():
        key = RAY_UNIT if any(item.get_closest_marker(RAY_UNIT) for item in module_items) \
            else path
        secs, unit_items = units.get(key, (0.0, []))
        units[key] = (secs + _module_secs(path, module_items, module_secs),
                      unit_items + module_items)
    items[:] = balanced_order(list(units.values()), workers)
