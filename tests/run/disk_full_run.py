"""Run in a mount namespace whose train_dir is a full tmpfs (tests/run/test_disk_full.py):

    python disk_full_run.py TRAIN_DIR FILLER

First validate_config's write probe on the full disk; then FILLER gives back 8 KiB, room
for run_training's own probe but not for a checkpoint, and a run's first save finds no
space. Prints
the probe's problem line and what the folder holds after each, as JSON lines; the run's
error goes to stderr as Python raises it."""

import json
import os
import sys

import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model


def main(train_dir, filler):
    os.makedirs(train_dir, exist_ok=True)
    try:
        towerlib.validate_config(train_dir=train_dir)
        problem = None
    except towerlib.ConfigError as error:
        problem = str(error)
    print(json.dumps({"probe": problem, "left": sorted(os.listdir(train_dir))}), flush=True)
    os.truncate(filler, os.path.getsize(filler) - 8192)
    try:
        with tf.Graph().as_default():
            towerlib.run_training(tiny_model.build(), train_dir=train_dir, max_steps=2,
                                  session_config=tiny_model.session_config(2),
                                  save_summaries_steps=None)
    finally:
        print(json.dumps({"left": sorted(os.listdir(train_dir))}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
