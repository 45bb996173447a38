"""Tests of --download against archives served by a local HTTP server on 127.0.0.1."""

import functools
import http.server
import io
import os
import tarfile
import threading
import time

import numpy as np
import pytest

from examples.cifar10 import data, download

RECORDS_PER_FILE = 4


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests_seen = []

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        type(self).requests_seen.append(self.path)
        if self.path.startswith("/short/"):  # promises more bytes than it sends
            body = b"x" * 100
            self.send_response(200)
            self.send_header("Content-Length", "5000")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path.startswith("/slow/"):  # answers after the client's timeout
            time.sleep(2.0)
        super().do_GET()


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/'served' at http://127.0.0.1:<port>/; stopped after the test."""
    root = tmp_path / "served"
    root.mkdir()
    _QuietHandler.requests_seen = []
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield root, "http://127.0.0.1:%d" % httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _file_bytes(index, num_records=RECORDS_PER_FILE):
    rng = np.random.default_rng(index)
    images = rng.integers(0, 256, size=(num_records, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=num_records)
    return data.encode_records(images, labels)


def _add(tar, name, payload):
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def _write_archive(path, overrides=None, extra=()):
    """A tar.gz in the release's layout; ``overrides`` maps a .bin name to its bytes,
    ``extra`` adds (TarInfo, payload) members."""
    overrides = overrides or {}
    with tarfile.open(str(path), "w:gz") as tar:
        for index, name in enumerate(data.TRAIN_FILES + data.TEST_FILES):
            _add(
                tar,
                "%s/%s" % (data.BATCHES_DIR, name),
                overrides.get(name, _file_bytes(index)),
            )
        for info, payload in extra:
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)


def _leftovers(folder):
    """Everything in ``folder`` except a finished cifar-10-batches-bin."""
    return sorted(n for n in os.listdir(str(folder)) if n != data.BATCHES_DIR)


def _download(data_dir, url):
    return download.download_and_extract(
        str(data_dir), url, timeout=5.0, log=lambda _: None
    )


def test_download_extracts_a_readable_data_set(server, tmp_path):
    root, base = server
    _write_archive(root / "cifar.tar.gz")
    data_dir = tmp_path / "data"
    path = _download(data_dir, base + "/cifar.tar.gz")
    assert path == str(data_dir / data.BATCHES_DIR)
    assert data.validate_split(str(data_dir), "train").num_examples == 5 * RECORDS_PER_FILE
    with open(os.path.join(path, "test_batch.bin"), "rb") as f:
        assert f.read() == _file_bytes(5)
    assert _leftovers(data_dir) == []  # no archive or staging folder left

    # A second call finds the data complete and does not fetch again.
    _download(data_dir, base + "/cifar.tar.gz")
    assert _QuietHandler.requests_seen == ["/cifar.tar.gz"]


def test_http_error_is_reported_with_url_and_status(server, tmp_path):
    _, base = server
    with pytest.raises(download.DownloadError, match=r"missing\.tar\.gz: HTTP 404"):
        _download(tmp_path / "data", base + "/missing.tar.gz")
    assert _leftovers(tmp_path / "data") == []


def test_connection_closed_early_is_an_incomplete_download(server, tmp_path):
    _, base = server
    with pytest.raises(download.DownloadError, match="incomplete: got 100 of 5000 bytes"):
        _download(tmp_path / "data", base + "/short/cifar.tar.gz")
    assert _leftovers(tmp_path / "data") == []


def test_unresponsive_server_times_out(server, tmp_path):
    root, base = server
    _write_archive(root / "cifar.tar.gz")
    start = time.monotonic()
    with pytest.raises(download.DownloadError, match="timed out"):
        download.download_and_extract(
            str(tmp_path / "data"),
            base + "/slow/cifar.tar.gz",
            timeout=0.3,
            log=lambda _: None,
        )
    assert time.monotonic() - start < 1.9
    assert _leftovers(tmp_path / "data") == []


def test_not_a_tar_gz_is_rejected(server, tmp_path):
    root, base = server
    (root / "page.tar.gz").write_bytes(b"<html>not an archive</html>")
    with pytest.raises(download.DownloadError, match="not a readable .tar.gz"):
        _download(tmp_path / "data", base + "/page.tar.gz")
    assert _leftovers(tmp_path / "data") == []


def test_path_traversal_member_is_refused_and_nothing_is_written(server, tmp_path):
    root, base = server
    evil = tarfile.TarInfo("cifar-10-batches-bin/../../evil.txt")
    evil.size = 4
    _write_archive(root / "evil.tar.gz", extra=[(evil, b"evil")])
    data_dir = tmp_path / "data"
    with pytest.raises(download.DownloadError, match="path traversal"):
        _download(data_dir, base + "/evil.tar.gz")
    assert not (tmp_path / "evil.txt").exists()
    assert os.listdir(str(data_dir)) == []


@pytest.mark.parametrize("kind", ["absolute", "symlink"])
def test_absolute_paths_and_links_are_refused(server, tmp_path, kind):
    root, base = server
    if kind == "absolute":
        member = tarfile.TarInfo(str(tmp_path / "abs.txt"))
        member.size = 1
        payload = b"a"
    else:
        member = tarfile.TarInfo("cifar-10-batches-bin/link")
        member.type = tarfile.SYMTYPE
        member.linkname = "/etc/passwd"
        payload = None
    _write_archive(root / "bad.tar.gz", extra=[(member, payload)])
    with pytest.raises(download.DownloadError, match="absolute path|link or special file"):
        _download(tmp_path / "data", base + "/bad.tar.gz")
    assert not (tmp_path / "abs.txt").exists()
    assert os.listdir(str(tmp_path / "data")) == []


def test_truncated_file_in_archive_is_reported_and_not_installed(server, tmp_path):
    root, base = server
    _write_archive(
        root / "cut.tar.gz", overrides={"data_batch_4.bin": _file_bytes(3)[:-10]}
    )
    data_dir = tmp_path / "data"
    with pytest.raises(download.DownloadError) as e:
        _download(data_dir, base + "/cut.tar.gz")
    assert "data_batch_4.bin" in str(e.value) and "truncated" in str(e.value)
    assert os.listdir(str(data_dir)) == []


def test_missing_file_in_archive_is_reported(server, tmp_path):
    root, base = server
    with tarfile.open(str(root / "partial.tar.gz"), "w:gz") as tar:
        _add(tar, data.BATCHES_DIR + "/data_batch_1.bin", _file_bytes(0))
    with pytest.raises(download.DownloadError, match="data_batch_2.bin.*missing"):
        _download(tmp_path / "data", base + "/partial.tar.gz")


def test_archive_without_the_binary_layout_is_reported(server, tmp_path):
    root, base = server
    with tarfile.open(str(root / "python.tar.gz"), "w:gz") as tar:
        _add(tar, "cifar-10-batches-py/data_batch_1", b"pickle")
    with pytest.raises(
        download.DownloadError, match="no cifar-10-batches-bin/.*cifar-10-batches-py"
    ):
        _download(tmp_path / "data", base + "/python.tar.gz")


def test_official_sizes_are_enforced_when_asked(server, tmp_path):
    root, base = server
    _write_archive(root / "cifar.tar.gz")
    with pytest.raises(download.DownloadError, match="30730000"):
        download.download_and_extract(
            str(tmp_path / "data"),
            base + "/cifar.tar.gz",
            timeout=5.0,
            expected_file_bytes=data.OFFICIAL_FILE_BYTES,
            log=lambda _: None,
        )
    assert os.listdir(str(tmp_path / "data")) == []


def test_invalid_existing_folder_is_replaced_only_by_a_good_download(server, tmp_path):
    root, base = server
    data_dir = tmp_path / "data"
    batches = data_dir / data.BATCHES_DIR
    batches.mkdir(parents=True)
    (batches / "data_batch_1.bin").write_bytes(b"truncated")
    # A failing download leaves the old folder as it was.
    with pytest.raises(download.DownloadError):
        _download(data_dir, base + "/missing.tar.gz")
    assert (batches / "data_batch_1.bin").read_bytes() == b"truncated"
    # A good one replaces it whole.
    _write_archive(root / "cifar.tar.gz")
    _download(data_dir, base + "/cifar.tar.gz")
    assert data.validate_split(str(data_dir), "train").num_examples == 5 * RECORDS_PER_FILE
    assert _leftovers(data_dir) == []


def test_train_flags_download_then_validate(server, tmp_path):
    # --data_dir with --download, as the train script plans it (no graph is built).
    from examples.cifar10 import job

    root, base = server
    _write_archive(root / "cifar.tar.gz")
    plan = job.plan_run(
        dict(
            train_dir=str(tmp_path / "run"),
            data_dir=str(tmp_path / "data"),
            download=True,
            download_url=base + "/cifar.tar.gz",
            num_towers=1,
            device_type="cpu",
            global_batch_size=4,
        )
    )
    assert plan.train_files.num_examples == 5 * RECORDS_PER_FILE
    assert plan.test_files.num_examples == RECORDS_PER_FILE
    assert not plan.test_files.generated
