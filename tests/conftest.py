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

import pytest

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
# trained run folder, are built once). Seconds of each module: its tests' durations, summed,
# as pytest's JUnit report gave them for one run of the whole suite on 2 shared cores under
# a load of 5-8, less what was cut from the module since (a newer module: timed alone, x 1.4).
# A module not listed counts SLOW_TEST_SECS per test marked slow and FAST_TEST_SECS per other
# test; one is listed when that count would be 5 s or more off.
MODULE_SECS = {
    "tests/cluster/test_ray_elastic.py": 234,
    "tests/cluster/test_resized_runs.py": 196,
    "tests/cluster/test_allreduce_training.py": 192,
    "tests/examples/test_cifar10_scripts.py": 173,
    "tests/examples/test_cifar10_run_folder.py": 159,
    "tests/examples/test_cifar10_replicated.py": 155,
    "tests/keras/test_keras_applications.py": 145,
    "tests/examples/test_cifar10_exact_runs.py": 132,
    "tests/cluster/test_allreduce_faults.py": 130,
    "tests/cluster/test_ray_train.py": 121,
    "tests/examples/test_launching_snippets.py": 121,
    "tests/bench/test_bench_multiworker.py": 120,
    "tests/examples/test_cifar10_precision.py": 116,
    "tests/bench/test_bench_smoke.py": 110,
    "tests/launch/test_launch_elastic.py": 110,
    "tests/cluster/test_distributed_ps_faults.py": 105,
    "tests/examples/test_cifar10_train.py": 101,
    "tests/keras/test_keras_as_keras.py": 100,
    "tests/cluster/test_allreduce_cifar10.py": 99,
    "tests/keras/test_keras_fine_tuning_lesson.py": 92,
    "tests/batchnorm/test_sync_batch_norm.py": 80,
    "tests/cluster/test_distributed_training.py": 79,
    "tests/keras/test_keras_tower.py": 79,
    "tests/step/test_accumulation.py": 71,
    "tests/update/test_replicated.py": 71,
    "tests/examples/test_cifar10_distributed.py": 69,
    "tests/launch/test_launch_end_to_end.py": 66,
    "tests/cluster/test_distributed_script_errors.py": 65,
    "tests/examples/test_output_noise.py": 64,
    "tests/examples/test_cifar10_eval_towers.py": 61,
    "tests/bench/test_bench_precision_memory.py": 53,
    "tests/cluster/test_allreduce_checkpoints.py": 50,
    "tests/step/test_accumulation_resume.py": 50,
    "tests/run/test_faults_kill.py": 48,
    "tests/examples/test_tower_loop_by_hand.py": 43,
    "tests/bench/test_bench_trace.py": 42,
    "tests/examples/test_large_batch_recipe.py": 41,  # 29.5 s alone, x 1.4
    "tests/run/test_faults_signals.py": 39,
    "tests/bench/test_bench_keras.py": 37,
    "tests/cluster/test_early_stopping.py": 37,
    "tests/examples/test_ray_train_example.py": 36,
    "tests/cluster/test_ps_run_to_run.py": 33,
    "tests/examples/test_readme.py": 33,
    "tests/keras/test_keras_lesson.py": 31,
    "tests/step/test_equivalence.py": 30,
    "tests/test_packaging.py": 30,
    "tests/precision/test_mixed_precision_training.py": 29,
    "tests/checks/test_bad_inputs_table.py": 25,
    "tests/test_layers.py": 25,
    "tests/bench/test_bench_build.py": 24,
    "tests/keras/test_keras_refusals.py": 24,
    "tests/batchnorm/test_tf1_batch_norm.py": 21,
    "tests/bench/test_bench_variable_update.py": 21,
    "tests/cluster/test_exits.py": 21,
    "tests/step/test_structure.py": 21,
    "tests/run/test_global_batches.py": 20,
    "tests/update/test_clipping.py": 20,
    "tests/update/test_broadcast.py": 19,
    "tests/launch/test_launcher.py": 18,
    "tests/exchange/test_collective.py": 17,
    "tests/bench/test_bench_global_batches.py": 16,
    "tests/run/test_evaluation_loop.py": 13,
    "tests/step/test_accumulation_graph.py": 13,
    "tests/launch/test_command.py": 12,
    "tests/test_public_api.py": 12,
    "tests/trace/test_traced_steps.py": 12,
    "tests/bench/test_traffic_machines.py": 10,
    "tests/run/test_folder_lock.py": 10,
    "tests/examples/test_cifar10_config.py": 9,
    "tests/launch/test_reaper.py": 9,
    "tests/keras/test_keras_half_precision.py": 8,
    "tests/internals/test_internals_sync_replicas.py": 7,
    "tests/update/test_trust_ratio_optimizers.py": 7,
    "tests/cluster/test_distributed_cluster.py": 6,
    "tests/examples/test_porting_doc.py": 6,
    "tests/keras/test_keras_fine_tuning.py": 6,
    "tests/keras/test_keras_review_cases.py": 6,
    "tests/step/test_accumulation_loop.py": 6,
    "tests/update/test_build_cost.py": 6,
    "tests/launch/test_startup.py": 5,
    "tests/precision/test_loss_scaling.py": 5,
    "tests/run/test_checkpoint_fit.py": 5,
    "tests/run/test_evaluation_noise.py": 5,
    "tests/launch/test_network.py": 1,
    "tests/launch/test_plan.py": 1,
    "tests/step/test_schedules.py": 1,
    "tests/trace/test_analysis.py": 1,
}
SLOW_TEST_SECS = 5.0
FAST_TEST_SECS = 0.25


def _module_secs(path, module_items):
    if path in MODULE_SECS:
        return MODULE_SECS[path]
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


def pytest_collection_modifyitems(config, items):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or len(items) < workers:
        return  # one process runs the tests in the order collected
    by_module = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::")[0], []).append(item)
    modules = [(_module_secs(path, module_items), module_items)
               for path, module_items in by_module.items()]
    items[:] = balanced_order(modules, workers)
