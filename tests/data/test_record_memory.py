"""A record source read by index holds what its pipeline prefetches, not its files: the
peak memory of a process reading a data set and one 4 times as large differ by far less
than the data they differ by."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.data.memory_job import RECORD_BYTES
from tests.data.record_files import write_shards

pytestmark = pytest.mark.slow

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_job.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = 400  # 1x: 26 MB of 64 KB records in 4 files; 4x: 105 MB
BATCH = 16
# Held at once, at most: 2 prefetched batches, the one being built and the reads in
# flight of the parallel map (at most a batch), each record once raw and once decoded.
HELD_BYTES = 4 * BATCH * RECORD_BYTES * 2
# Allocator and thread-stack noise between two processes doing the same work.
NOISE_BYTES = 24 * 2**20


def write(kind, folder, records):
    if kind == "tfrecords":
        features = np.zeros([records, 6], np.float32)
        write_shards(folder, features, np.arange(records) % 10, 4,
                     padding=RECORD_BYTES - 60)
        return
    folder.mkdir(parents=True)
    rows = np.zeros([records, RECORD_BYTES], np.uint8)
    rows[:, :4] = np.arange(records, dtype=np.int32).view(np.uint8).reshape(records, 4)
    for k, part in enumerate(np.array_split(rows, 4)):
        part.tofile(str(folder / f"part-{k}.bin"))


def peak_rss_bytes(kind, folder):
    done = subprocess.run(
        [sys.executable, JOB, f"--kind={kind}", f"--data_dir={folder}", "--steps=30",
         f"--batch={BATCH}"], capture_output=True, text=True, timeout=300, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert done.returncode == 0, done.stderr[-3000:]
    return int(re.search(r"peak_rss_kb (\d+)", done.stdout).group(1)) * 1024


@pytest.mark.parametrize("kind", ["tfrecords", "fixed"])
def test_peak_memory_stays_flat_while_the_data_set_grows_4_times(tmp_path, kind):
    write(kind, tmp_path / "1x", RECORDS)
    write(kind, tmp_path / "4x", 4 * RECORDS)
    grown = 3 * RECORDS * RECORD_BYTES
    small, large = (peak_rss_bytes(kind, tmp_path / size) for size in ("1x", "4x"))
    assert large - small < HELD_BYTES + NOISE_BYTES < grown / 2, (small, large, grown)
