"""bench/final_checkpoints.py: one line per configuration, the same line run after run.

The script guards refactors that must change no number (a fixed-seed run's final
checkpoint, bit for bit), so its own output must repeat exactly on unchanged code.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = "bench/final_checkpoints.py"
CHEAP = "first_tower/parameter_server"
LINE = re.compile(r"^(\S+) ([0-9a-f]{64}) (\d+)$")


def run_script(*flags):
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, SCRIPT, *flags], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.slow  # two fresh processes, each training a configuration (~25 s together)
def test_a_configuration_prints_one_digest_line_and_repeats_it(tmp_path):
    runs = [run_script(f"--only={CHEAP}", f"--out={tmp_path / f'run{i}.txt'}")
            for i in range(2)]
    for result in runs:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [[line for line in result.stdout.splitlines() if LINE.match(line)]
             for result in runs]
    assert len(lines[0]) == 1, runs[0].stdout
    name, _, count = LINE.match(lines[0][0]).groups()
    assert name == CHEAP
    # conv1, conv2 and logits' weights (and biases), bn1 and bn2's 4 variables, each
    # trainable one's Momentum slot, global_step.
    assert int(count) == 21
    assert lines[0] == lines[1], "two runs of the same configuration differ"
    assert (tmp_path / "run0.txt").read_text() == lines[0][0] + "\n"


def test_an_only_that_matches_nothing_is_one_line_and_status_2():
    result = run_script("--only=no_such_configuration")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: --only='no_such_configuration' matches no configuration. Fix:")
