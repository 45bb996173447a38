"""docs/porting.md's python blocks run, in order, as one program."""

import pathlib
import re
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a fresh Python process
def test_porting_guide_code_runs():
    guide = (ROOT / "docs" / "porting.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, re.S)
    assert len(blocks) >= 4
    result = subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)], cwd=ROOT, capture_output=True,
        text=True, timeout=300,
        env={"PYTHONPATH": helpers.python_path(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
             "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
