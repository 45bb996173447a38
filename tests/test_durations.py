"""The test schedule's seconds come from a measured file, which a recording run rewrites."""

import json
import os
import subprocess
import sys
import types

import pytest

from tests import conftest, durations

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_committed_durations_file_reads_and_names_existing_modules():
    secs = durations.read_module_secs()
    assert secs and all(os.path.isfile(os.path.join(ROOT, name)) for name in secs), secs


def test_a_missing_file_reads_as_empty_and_a_broken_one_is_named(tmp_path):
    assert durations.read_module_secs(str(tmp_path / "none.json")) == {}
    broken = tmp_path / "broken.json"
    broken.write_text('{"modules": {"tests/a.py": -1}}')
    with pytest.raises(ValueError, match=r"broken.json: expected .*Fix: restore it"):
        durations.read_module_secs(str(broken))
    broken.write_text("{")
    with pytest.raises(ValueError, match=r"broken.json: not JSON"):
        durations.read_module_secs(str(broken))


def test_writing_merges_orders_longest_first_and_drops_modules_that_are_gone(tmp_path):
    (tmp_path / "tests").mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / "tests" / name).write_text("")
    path = str(tmp_path / "durations.json")
    durations.write_module_secs(path, {"tests/a.py": 3.0, "tests/b.py": 1.0,
                                       "tests/gone.py": 9.0})
    durations.write_module_secs(path, {"tests/b.py": 5.04, "tests/c.py": 2.0},
                                root=str(tmp_path))
    data = json.loads((tmp_path / "durations.json").read_text())
    assert list(data["modules"].items()) == [
        ("tests/b.py", 5.0), ("tests/a.py", 3.0), ("tests/c.py", 2.0)]
    assert not os.path.exists(path + ".partial")


def test_the_recorder_sums_setup_call_and_teardown_per_module(tmp_path):
    recorder = durations.DurationRecorder(str(tmp_path / "d.json"))
    for nodeid, seconds in [("tests/x.py::a", 1.0), ("tests/x.py::a", 2.5),
                            ("tests/x.py::b[1]", 0.5), ("tests/y.py::c", 4.0)]:
        recorder.pytest_runtest_logreport(types.SimpleNamespace(nodeid=nodeid,
                                                                duration=seconds))
    assert recorder.module_secs == {"tests/x.py": 4.0, "tests/y.py": 4.0}


class _Item:
    def __init__(self, nodeid, slow=False, ray=False):
        self.nodeid, self._markers = nodeid, {"slow": slow, conftest.RAY_UNIT: ray}

    def get_closest_marker(self, name):
        return self._markers.get(name) or None


def test_the_schedule_puts_the_longest_module_of_the_file_first(tmp_path, monkeypatch):
    path = tmp_path / "durations.json"
    monkeypatch.setattr(durations, "DEFAULT_FILE", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    items = [_Item(f"tests/{m}.py::t{i}") for m in ("a", "b", "c", "d") for i in range(2)]

    def first_modules(order):
        return [order[0].nodeid.split("::")[0], order[4].nodeid.split("::")[0]]

    durations.write_module_secs(str(path), {"tests/c.py": 100.0, "tests/d.py": 50.0})
    ordered = list(items)
    conftest.pytest_collection_modifyitems(None, ordered)
    assert first_modules(ordered) == ["tests/c.py", "tests/d.py"]  # a, b: 0.5 s each
    durations.write_module_secs(str(path), {"tests/b.py": 400.0, "tests/a.py": 300.0})
    ordered = list(items)
    conftest.pytest_collection_modifyitems(None, ordered)
    assert first_modules(ordered) == ["tests/b.py", "tests/a.py"]


def test_modules_with_a_ray_cluster_run_one_after_the_other_on_one_worker(tmp_path,
                                                                          monkeypatch):
    """The two longest modules would start on the two workers at once; both hold a Ray
    cluster, so they form one unit on one worker's slice, one after the other."""
    path = tmp_path / "durations.json"
    monkeypatch.setattr(durations, "DEFAULT_FILE", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    items = [_Item(f"tests/{m}.py::t{i}", ray=m in ("r1", "r2"))
             for m in ("a", "r1", "b", "r2", "c") for i in range(2)]
    durations.write_module_secs(str(path), {"tests/r1.py": 400.0, "tests/r2.py": 300.0,
                                            "tests/a.py": 350.0, "tests/b.py": 200.0,
                                            "tests/c.py": 100.0})
    ordered = list(items)
    conftest.pytest_collection_modifyitems(None, ordered)
    modules = [item.nodeid.split("::")[0] for item in ordered]
    assert modules[:4] == ["tests/r1.py"] * 2 + ["tests/r2.py"] * 2
    assert not {"tests/r1.py", "tests/r2.py"} & set(modules[4:])


@pytest.mark.slow
def test_a_recording_run_under_xdist_writes_the_modules_it_ran(tmp_path):
    path = tmp_path / "durations.json"
    env = dict(os.environ, **{durations.RECORD_ENV: str(path)})
    module = "tests/launch/test_plan.py"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:randomly",
                    module], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=300)
    secs = durations.read_module_secs(str(path))
    assert list(secs) == [module] and secs[module] > 0
