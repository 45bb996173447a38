"""The README's example runs as printed."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # trains the example in a fresh process
def test_readme_api_example_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Example"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={"PYTHONPATH": helpers.python_path(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
                          "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "global_step 20" in result.stdout


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"Tests .*?```bash\n(.*?)\n```", readme, re.S).group(1)
    assert command in ci


def test_readme_links_and_paths_exist():
    """Every relative link of the README names a file or folder of the repository."""
    readme = (ROOT / "README.md").read_text()
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", readme)
             if "://" not in link]
    assert links
    missing = [link for link in links if link and not (ROOT / link).exists()]
    assert not missing, missing


def test_readme_names_no_removed_keyword():
    """The strategies are objects now; the old keywords of build_train_graph are gone."""
    readme = (ROOT / "README.md").read_text()
    for keyword in ("variable_update=", "compute_dtype=", "param_device=", "loss_scale=",
                    "gradient_pack_bytes=", "sync_transport=", "sync_timeout_seconds=",
                    "allreduce_in_compute_dtype="):
        # Float16(loss_scale=...) is the object's own argument, not the old keyword, and
        # --variable_update= a script's command-line flag.
        assert not re.search(r"(?<![(\w-])" + keyword, readme), keyword


def _launcher_command(train_dir):
    """The README's launcher command, with this interpreter and `train_dir`."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("Several machines"):]
    words = shlex.split(re.search(r"```bash\n(.*?)\n```", section, re.S).group(1))
    assert words[0] == "towerlib-launch" and "python" in words
    assert any(w.startswith("--train_dir=") for w in words), "name the run's folder"
    words = [sys.executable, "-m", "towerlib.launch"] + words[1:]
    words[words.index("python")] = sys.executable
    return [f"--train_dir={train_dir}" if w.startswith("--train_dir=") else w
            for w in words]


@pytest.mark.slow  # two launched jobs of two workers each
def test_the_readme_launcher_command_runs_and_a_second_run_says_it_is_done(tmp_path):
    environ = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT),
                   TF_CPP_MIN_LOG_LEVEL="2")
    environ.pop("TF_CONFIG", None)
    command = _launcher_command(tmp_path / "run")
    outputs = []
    for _ in range(2):
        result = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        outputs.append(result.stdout + result.stderr)
    for worker in (0, 1):
        assert f"[worker {worker}] finished: global_step=20 loss=" in outputs[0]
        assert (f"[worker {worker}] finished: nothing to train, --train_dir="
                f"{tmp_path / 'run'} is already at global step 20") in outputs[1]
    assert "Fix: a higher --max_steps to continue that run, or another --train_dir" in (
        outputs[1])
