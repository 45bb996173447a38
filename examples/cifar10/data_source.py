"""Where a run's data comes from: a given folder, a download, or the generated set.

- ``--data_dir`` given: that folder (holding ``cifar-10-batches-bin/`` or the .bin files).
- ``--data_dir`` and ``--download``: the official archive (or ``--download_url``) is
  fetched into it first, unless a complete copy is already there.
- neither: the built-in generated data set under ``<train_dir>/generated_data``, written
  on first use; every script then logs loudly that it is NOT training on CIFAR-10.

Everything is validated here, before any graph is built.
"""

import logging
import os
from typing import Callable, Optional, Tuple

from examples.cifar10 import data, download, generate

GENERATED_SUBDIR = "generated_data"

GENERATED_NOTICE = (
    "NOTE: using the GENERATED data set in %s (10 classes of synthetic textures and "
    "shapes in the CIFAR-10 file format), NOT the real CIFAR-10. Pass --data_dir (and "
    "--download) to use CIFAR-10."
)


def default_generated_dir(train_dir: str) -> str:
    return os.path.join(train_dir, GENERATED_SUBDIR)


def is_generated_dir(data_dir: str, train_dir: str) -> bool:
    """Whether data_dir is the generated set of train_dir (recorded as '')."""
    return not data_dir or os.path.abspath(data_dir) == os.path.abspath(
        default_generated_dir(train_dir))


def prepare(
    data_dir: Optional[str],
    train_dir: str,
    download_requested: bool = False,
    download_url: str = "",
    log: Callable[[str], None] = logging.info,
    need_train: bool = True,
) -> Tuple[str, Optional[data.SplitFiles], data.SplitFiles]:
    """Makes the data available and validates the splits.

    Returns:
      (data_dir actually used, train SplitFiles (None unless need_train), test SplitFiles).

    Raises:
      data.DataError, download.DownloadError: with the file and the fix.
    """
    if data_dir:
        if download_requested:
            download.download_and_extract(
                data_dir, download_url or download.DEFAULT_URL, log=log
            )
    else:
        data_dir = default_generated_dir(train_dir)
        if not os.path.isdir(os.path.join(data_dir, data.BATCHES_DIR)):
            log("Generating the built-in data set into %s" % data_dir)
        generate.ensure_generated(data_dir)
    train_files = data.validate_split(data_dir, "train") if need_train else None
    test_files = data.validate_split(data_dir, "test")
    if test_files.generated:
        log(GENERATED_NOTICE % test_files.batches_dir)
    return data_dir, train_files, test_files
