"""Fetch and unpack the CIFAR-10 binary release, safely and atomically.

``download_and_extract(data_dir)`` leaves either a complete, validated
``data_dir/cifar-10-batches-bin/`` or nothing new at all:

1. the archive is streamed into a temporary file inside ``data_dir`` (its length checked
   against the server's Content-Length, so a dropped connection is not taken for the end);
2. it is unpacked into a temporary folder inside ``data_dir``, member by member, refusing
   absolute paths, ``..`` components, links and device files (no path traversal);
3. the unpacked files are checked: every expected file present, its size a positive
   multiple of 3073 bytes (exactly 30730000 for the official release), labels in 0..9;
4. only then is the folder renamed into place; temporary files are removed on every path.
"""

import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from typing import Callable, Optional, Union

from examples.cifar10 import data

DEFAULT_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
DEFAULT_TIMEOUT_SECONDS = 60.0
CHUNK_BYTES = 1 << 20
# The official archive unpacks to about 185 MB; refuse archives that claim far more.
MAX_EXTRACTED_BYTES = 1 << 30

_MANUAL_FIX = (
    "Fix: check the URL and the network, or download the archive by hand and "
    "extract it so that --data_dir holds %s/." % data.BATCHES_DIR
)


class DownloadError(RuntimeError):
    """The archive could not be fetched, is not a safe tar.gz, or holds the wrong files."""


def _fetch(url: str, target_path: str, timeout: float, log: Callable[[str], None]) -> int:
    """Streams ``url`` into ``target_path``; returns the bytes written."""
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise DownloadError(
            "Could not download %s: HTTP %d %s. %s" % (url, e.code, e.reason, _MANUAL_FIX)
        ) from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(
            "Could not download %s: %s. %s" % (url, reason, _MANUAL_FIX)
        ) from e
    with response:
        length_header = response.headers.get("Content-Length")
        expected = int(length_header) if length_header and length_header.isdigit() else None
        written = 0
        next_report = 0.1
        try:
            with open(target_path, "wb") as out:
                while True:
                    chunk = response.read(CHUNK_BYTES)
                    if not chunk:
                        break
                    out.write(chunk)
                    written += len(chunk)
                    if expected and written >= next_report * expected:
                        log(
                            "Downloading %s: %3d%% (%d of %d bytes)"
                            % (url, 100 * written // expected, written, expected)
                        )
                        next_report = written / expected + 0.1
        except OSError as e:  # includes socket timeouts in the middle of the body
            raise DownloadError(
                "Download of %s failed after %d bytes: %s. %s"
                % (url, written, e, _MANUAL_FIX)
            ) from e
    if expected is not None and written != expected:
        raise DownloadError(
            "Download of %s is incomplete: got %d of %d bytes (the connection "
            "closed early). Fix: run again with --download." % (url, written, expected)
        )
    if written == 0:
        raise DownloadError("Download of %s is empty. %s" % (url, _MANUAL_FIX))
    return written


def _check_member(member: tarfile.TarInfo, archive_name: str) -> None:
    """Raises DownloadError unless ``member`` is a plain file or folder with a relative path
    that stays inside the extraction folder."""
    name = member.name
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or os.path.isabs(name) or (parts and ":" in parts[0]):
        raise DownloadError(
            "Refusing to extract %r: member %r has an absolute path." % (archive_name, name)
        )
    if ".." in parts:
        raise DownloadError(
            "Refusing to extract %r: member %r would be written outside the "
            "extraction folder (path traversal)." % (archive_name, name)
        )
    if not (member.isfile() or member.isdir()):
        raise DownloadError(
            "Refusing to extract %r: member %r is a link or special file; "
            "the CIFAR-10 archive holds only plain files." % (archive_name, name)
        )


def _extract(archive_path: str, archive_name: str, destination: str) -> None:
    """Unpacks the tar.gz at ``archive_path`` into the existing folder ``destination``."""
    try:
        tar = tarfile.open(archive_path, "r:gz")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DownloadError(
            "%s is not a readable .tar.gz archive (%s). %s" % (archive_name, e, _MANUAL_FIX)
        ) from e
    root = os.path.realpath(destination)
    total = 0
    with tar:
        try:
            for member in tar:
                _check_member(member, archive_name)
                target = os.path.realpath(os.path.join(root, member.name))
                if os.path.commonpath([root, target]) != root:
                    raise DownloadError(
                        "Refusing to extract %r: member %r resolves outside the "
                        "extraction folder." % (archive_name, member.name)
                    )
                if member.isdir():
                    os.makedirs(target, exist_ok=True)
                    continue
                total += member.size
                if total > MAX_EXTRACTED_BYTES:
                    raise DownloadError(
                        "Refusing to extract %r: it unpacks to more than %d bytes; "
                        "the CIFAR-10 archive is far smaller."
                        % (archive_name, MAX_EXTRACTED_BYTES)
                    )
                os.makedirs(os.path.dirname(target), exist_ok=True)
                source = tar.extractfile(member)
                with source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK_BYTES)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise DownloadError(
                "%s is damaged or truncated (%s). Fix: run again with "
                "--download." % (archive_name, e)
            ) from e


def _check_unpacked(batches_dir: str, url: str, expected_file_bytes: Optional[int]) -> None:
    if not os.path.isdir(batches_dir):
        found = sorted(os.listdir(os.path.dirname(batches_dir)))
        raise DownloadError(
            "The archive from %s has no %s/ folder (its top level holds %s); "
            "it is not the CIFAR-10 binary release (the python and matlab "
            "versions have other layouts). %s"
            % (url, data.BATCHES_DIR, found or "nothing", _MANUAL_FIX)
        )
    for name in data.TRAIN_FILES + data.TEST_FILES:
        try:
            data.check_record_file(os.path.join(batches_dir, name), expected_file_bytes)
        except data.DataError as e:
            raise DownloadError(
                "The archive from %s holds a bad file: %s" % (url, e)
            ) from e


def is_complete(data_dir: str, expected_file_bytes: Optional[int] = None) -> bool:
    """True when ``data_dir/cifar-10-batches-bin`` holds all files, each valid."""
    batches_dir = os.path.join(data_dir, data.BATCHES_DIR)
    try:
        for name in data.TRAIN_FILES + data.TEST_FILES:
            data.check_record_file(os.path.join(batches_dir, name), expected_file_bytes)
    except data.DataError:
        return False
    return True


def download_and_extract(
    data_dir: str,
    url: str = DEFAULT_URL,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    expected_file_bytes: Union[int, None, str] = "auto",
    log: Callable[[str], None] = logging.info,
) -> str:
    """Makes ``data_dir/cifar-10-batches-bin`` hold a valid copy of the archive at ``url``.

    Args:
      data_dir: folder to hold ``cifar-10-batches-bin/``; created if missing.
      url: a .tar.gz of the CIFAR-10 binary release layout.
      timeout: seconds to wait for the server to connect or send the next bytes.
      expected_file_bytes: the exact size of every .bin file; 'auto' (default) means 30730000
        for the official URL and "any positive multiple of 3073" for any other URL (small
        test archives); None means always the latter.
      log: where progress lines go.

    Returns:
      The path of ``cifar-10-batches-bin``.

    Raises:
      DownloadError: naming the URL or the file, and what to do. Nothing is left behind:
        an existing valid folder is reused without downloading, and an existing invalid one
        is replaced only after the new copy has been downloaded and checked.
    """
    if expected_file_bytes == "auto":
        expected_file_bytes = data.OFFICIAL_FILE_BYTES if url == DEFAULT_URL else None
    os.makedirs(data_dir, exist_ok=True)
    destination = os.path.join(data_dir, data.BATCHES_DIR)
    if is_complete(data_dir, expected_file_bytes):
        log("CIFAR-10 is already in %s; not downloading." % destination)
        return destination

    archive_name = os.path.basename(url.split("?")[0]) or "archive"
    fd, archive_path = tempfile.mkstemp(dir=data_dir, prefix=".download-", suffix=".tar.gz")
    os.close(fd)
    staging = tempfile.mkdtemp(dir=data_dir, prefix=".extract-")
    try:
        log("Downloading %s into %s" % (url, data_dir))
        size = _fetch(url, archive_path, timeout, log)
        log("Downloaded %d bytes; extracting." % size)
        _extract(archive_path, archive_name, staging)
        unpacked = os.path.join(staging, data.BATCHES_DIR)
        _check_unpacked(unpacked, url, expected_file_bytes)
        if os.path.exists(destination):
            log(
                "Replacing the incomplete or invalid %s with the new download."
                % destination
            )
            old = tempfile.mkdtemp(dir=data_dir, prefix=".replaced-")
            os.rename(destination, os.path.join(old, data.BATCHES_DIR))
            os.rename(unpacked, destination)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(unpacked, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if os.path.exists(archive_path):
            os.remove(archive_path)
    log("CIFAR-10 is ready in %s" % destination)
    return destination


def main():
    import argparse

    parser = argparse.ArgumentParser(description="Download and extract CIFAR-10 (binary).")
    parser.add_argument("data_dir")
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(download_and_extract(args.data_dir, args.url, args.timeout))
    except DownloadError as e:
        raise SystemExit("error: %s" % e) from e


if __name__ == "__main__":
    main()
