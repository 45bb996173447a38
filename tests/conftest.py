"""Fixtures shared by the test modules: the processes a test starts, always stopped.

Here rather than in the repository's conftest.py, which sets up what every
run needs (quiet TensorFlow, the repository importable): these fixtures are
for tests only, next to tests/helpers.py, and load only when tests are collected.
"""

import pytest

from tests.distributed_processes import ProcessGroup
from tests.fault_scripts.runner import ProcessPool


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
