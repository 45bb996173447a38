"""The tiny model trained by towerlib.run_training, as a subprocess to kill.

Prints 'START STEP <global step>' once the session exists (restored or new),
'STEP <n>' after every step and 'DONE ...' when run_training returns.
`--die_at POINT:STEP` SIGKILLs the process itself at an exact point of the
checkpoint protocol, which an outside kill can only hit by luck:

  stage:S   Saver.save wrote step S into train_dir/.saving, nothing published;
  index:S   step S's data and .meta are in train_dir, its .index is not;
  state:S   step S is complete, the new state file is written to a temporary
            file but not renamed over 'checkpoint';
  delete:S  the old checkpoint S, dropped by max_to_keep, has lost its .index
            but not its data yet.

`--abort_every_step` makes every step fail with an AbortedError (printing
'ABORTING'), as a lost ps task does: the session is recreated again and again.
"""

import argparse
import logging
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root

import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from tests.fault_scripts import tiny_model  # noqa: E402
from towerlib.run import (
    checkpoints,  # noqa: E402
    durable_files,  # noqa: E402
    sessions,  # noqa: E402
)
from towerlib.run.loop_hooks import step_after_update  # noqa: E402


def _die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def inject_fault(point, step, train_dir):
    prefix = os.path.join(train_dir, f"{checkpoints.DEFAULT_BASENAME}-{step}")
    if point == "stage":
        original_stage = checkpoints.CheckpointWriter._stage

        def stage(self, session, save_step):
            staged = original_stage(self, session, save_step)
            if save_step == step:
                _die()
            return staged

        checkpoints.CheckpointWriter._stage = stage
    elif point in ("index", "state"):
        original_rename = durable_files.rename

        def rename(source, target):
            if point == "index" and target == prefix + ".index":
                _die()
            if point == "state" and os.path.basename(target) == checkpoints.STATE_FILENAME:
                with open(source, encoding="utf-8") as handle:
                    if f'model_checkpoint_path: "{os.path.basename(prefix)}"' in handle.read():
                        _die()
            original_rename(source, target)

        durable_files.rename = rename
    elif point == "delete":
        original_remove = durable_files.remove_file

        def remove(path):
            if path.startswith(prefix + ".data-"):
                _die()
            original_remove(path)

        durable_files.remove_file = remove
    else:
        raise ValueError(f"Unknown fault point {point!r}.")


class PrintSteps(tf.compat.v1.train.SessionRunHook):
    def __init__(self, train_graph, sleep):
        self.global_step = train_graph.global_step
        self.step_after = step_after_update(train_graph)
        self.sleep = sleep

    def after_create_session(self, session, coord):
        print(f"START STEP {session.run(self.global_step)}", flush=True)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self.step_after)

    def after_run(self, run_context, run_values):
        print(f"STEP {run_values.results}", flush=True)
        if self.sleep:
            time.sleep(self.sleep)


class AbortEveryStep(tf.compat.v1.train.SessionRunHook):
    """Every step fails as a restarted ps task makes it fail (a recreation each)."""

    def before_run(self, run_context):
        print("ABORTING", flush=True)
        time.sleep(0.05)
        raise tf.errors.AbortedError(None, None, "a ps task restarted (test)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train_dir", required=True)
    parser.add_argument("--max_steps", type=int, required=True)
    parser.add_argument("--save_every", type=int, default=2)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--die_at", default=None, help="POINT:STEP")
    parser.add_argument("--abort_every_step", action="store_true")
    parser.add_argument("--max_recreations", type=int, default=None)
    args = parser.parse_args()

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("towerlib %(levelname)s %(message)s"))
    logger = logging.getLogger("towerlib")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    if args.die_at:
        point, step = args.die_at.split(":")
        inject_fault(point, int(step), args.train_dir)
    if args.max_recreations is not None:
        sessions.MAX_SESSION_RECREATIONS = args.max_recreations
    extra_hooks = [AbortEveryStep()] if args.abort_every_step else []

    with tf.Graph().as_default():
        train = tiny_model.build(seed=args.seed)
        result = towerlib.run_training(
            train, train_dir=args.train_dir, max_steps=args.max_steps,
            save_checkpoint_steps=args.save_every, max_checkpoints_to_keep=args.keep,
            session_config=tiny_model.session_config(2), log_every_n_steps=1000,
            save_summaries_steps=None,
            hooks=[PrintSteps(train, args.step_sleep)] + extra_hooks)
    print(f"DONE step={result.global_step} signal={result.stop_signal} "
          f"checkpoint={result.checkpoint}", flush=True)


if __name__ == "__main__":
    main()
