"""A train_dir starting with '~' is refused: Python does not expand it."""

import os

import pytest

import towerlib


def test_a_tilde_train_dir_is_refused_before_anything_is_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(towerlib.ConfigError, match=r"train_dir: '~/runs/a' starts with '~', "
                       r"which only a shell expands.*os\.path\.expanduser\('~/runs/a'\)"):
        towerlib.validate_config(train_dir="~/runs/a", max_steps=3)
    assert os.listdir(tmp_path) == []   # no folder named '~'
