"""The user guide and the API reference (generated from the docstrings by mkdocstrings)
build with every warning an error: `mkdocs build --strict`, as mkdocs.yml configures it.

A docstring that griffe cannot parse, a nav entry naming no page or a broken anchor
fails this test. mkdocs and mkdocstrings[python] come with the `test` extra (and the
`docs` extra), so every CI venv has them: the test is never skipped.
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert (site / "reference" / "building" / "index.html").exists()
    built = (site / "reference" / "building" / "index.html").read_text()
    assert 'id="towerlib.build_train_graph"' in built
