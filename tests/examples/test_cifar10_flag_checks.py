"""The scripts' own flags that exited 1 with a traceback, or were accepted: each is one
FlagError line naming the flag and the fix."""

import types

import pytest

from examples.cifar10 import eval as eval_lib
from examples.cifar10 import options


@pytest.mark.parametrize("url, data_dir, message", [
    ("notaurl", None, "--download_url=notaurl: it is not an http://, https:// or file:// "
                      "URL. Fix: e.g. --download_url=https://"),
    ("ftp://example.com/c.tar.gz", None, "is not an http://, https:// or file:// URL"),
    ("https://example.com/c.tar.gz", "a_file", "it is a file; --download puts "
                                               "cifar-10-batches-bin/ in a folder"),
])
def test_download_flags(tmp_path, url, data_dir, message):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(options.FlagError) as raised:
        options.check_download_flags(url, str(tmp_path / (data_dir or "new_folder")))
    assert message in str(raised.value)
    options.check_download_flags("file:///data/c.tar.gz", str(tmp_path / "new_folder"))


@pytest.mark.parametrize("flag, value, message", [
    ("eval_timeout_secs", -1, "--eval_timeout_secs=-1: use a number >= 0."),
    ("eval_interval_secs", -5, "--eval_interval_secs=-5: use a number >= 0."),
    ("eval_batch_size", 0, "--eval_batch_size=0: use a number >= 1."),
])
def test_eval_flags(flag, value, message):
    flags = dict(eval_batch_size=500, eval_interval_secs=30, eval_timeout_secs=600,
                 num_towers=None)
    eval_lib.check_eval_flags(types.SimpleNamespace(**flags))
    flags[flag] = value
    with pytest.raises(options.FlagError, match=message.replace("(", r"\(")):
        eval_lib.check_eval_flags(types.SimpleNamespace(**flags))
