r"""The CIFAR-10 example end to end: data, training on 2 towers, evaluation, export.

    python -m examples.cifar10.main

With no flags: generates the built-in data set (if it is not there yet), trains the
tutorial convnet on 2 towers (virtual CPU devices when there is no GPU) with a global
batch of 128, evaluates precision@1 on the test file, exports a SavedModel, checks the
SavedModel gives the same precision, and prints the figures. Every flag of train.py
works here too (e.g. --model=resnet20 --data_dir=/data/cifar10 --download); rerunning
with the same --train_dir resumes from its last checkpoint.
"""

import time

_PROCESS_START = time.time()  # before TensorFlow's import, to time the whole job

from examples.cifar10 import command_line, default_dirs, options  # noqa: E402

# The main job's defaults where they differ from the train script's (the convnet, a global
# batch of 128, learning rate 0.01, bn_momentum 0.9): >= 95% on the generated data in a
# few minutes on 2 CPU cores (see docs/cifar10.md for the measured figures).
MAIN_DEFAULTS = {
    "train_dir": default_dirs.default_train_dir("main"),  # per user and clone
    "num_towers": 2,
    "train_epochs": 16,
    "lr_decay_epochs": [10.0, 14.0],
    "ema_decay": 0.99,
    "save_checkpoint_steps": 200,
}
SCRIPT_FLAGS = options.TRAIN_FLAGS
# --help and a bad flag answer here, from the flag tables, before TensorFlow loads.
command_line.parse_flags_before_tensorflow(__name__, SCRIPT_FLAGS, MAIN_DEFAULTS)

import contextlib  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from examples.cifar10 import (  # noqa: E402  # noqa: E402
    data,
    job,
    run_folder,
    script_runner,  # noqa: E402
)
from examples.cifar10 import eval as eval_lib
from examples.cifar10 import export as export_lib

logger = logging.getLogger("cifar10")

# tf.saved_model.load logs these at INFO (through absl's logger, which the scripts show)
# for a SavedModel without a fingerprint.pb: the TF 1 SavedModelBuilder export.py uses does
# not write one, and nothing needs it. Only these two lines are dropped, only while loading.
NO_FINGERPRINT_NOTES = (
    "Fingerprint not found. Saved model loading will continue.",
    "path_and_singleprint metric could not be logged. Saved model loading will continue.",
)


class _NoFingerprintNotes(logging.Filter):
    def filter(self, record):
        return record.getMessage() not in NO_FINGERPRINT_NOTES


@contextlib.contextmanager
def without_fingerprint_notes(logger_name: str = "absl"):
    """While inside: the loader's NO_FINGERPRINT_NOTES are not logged."""
    logger = logging.getLogger(logger_name)
    drop = _NoFingerprintNotes()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def check_saved_model(
    saved_model_dir: str, test_files: data.SplitFiles, batch_size: int = 1000
) -> float:
    """Loads the SavedModel as a user would and returns its precision@1 on the test files
    (uint8 images through the default signature)."""
    with without_fingerprint_notes():
        loaded = tf.saved_model.load(saved_model_dir)
    serve = loaded.signatures["serving_default"]
    correct = total = 0
    for path in test_files.paths:
        images, labels = data.read_records_numpy(path)
        for start in range(0, len(labels), batch_size):
            classes = serve(images=tf.constant(images[start : start + batch_size]))[
                "classes"
            ]
            correct += int(np.sum(classes.numpy() == labels[start : start + batch_size]))
            total += len(labels[start : start + batch_size])
    return correct / total


def refuse_cluster(tf_config: str) -> None:
    """The main job trains on one machine: a cluster in TF_CONFIG is refused."""
    try:
        cluster = towerlib.cluster.cluster_from_tf_config(tf_config)
    except ValueError:
        cluster = True  # malformed, but meant for a cluster all the same
    if cluster is not None:
        raise options.FlagError(
            "TF_CONFIG describes a cluster, but examples.cifar10.main trains on this "
            "machine only. Fix: run examples.cifar10.train on every task of the cluster "
            "(docs/distributed.md), then examples.cifar10.eval and .export on the chief's "
            "--train_dir; or unset TF_CONFIG."
        )


def main_defaults() -> dict:
    """The train flags' defaults, with the main job's own."""
    return dict(options.train_defaults(), **MAIN_DEFAULTS)


def run(args: dict, defaults: dict = None) -> dict:
    """Trains, evaluates and exports; returns the figures printed at the end, or, when a
    signal stopped training, {'stopped': the planning.TrainResult, 'train_dir': ...}
    without evaluating or exporting the unfinished run.

    Args:
      args: {flag: value} of the train flags given (the others: the recorded run's, else
        `defaults`, the main job's when None).
    """
    start = time.time()
    defaults = defaults or main_defaults()
    train_dir = args.get("train_dir") or defaults["train_dir"]
    result = job.train(args, defaults)
    if result.stop_signal:   # Ctrl-C or SIGTERM: an unfinished run is not evaluated
        return {"stopped": result, "train_dir": train_dir}
    trained = time.time()
    evaluation = eval_lib.evaluate_latest(
        train_dir,
        batch_size=500,
        eval_dir=os.path.join(train_dir, "eval"),
        num_towers=len(result.plan.devices),
    )
    evaluated = time.time()
    saved_model_dir = export_lib.export(train_dir)
    exported = time.time()
    saved_model_precision = check_saved_model(saved_model_dir, result.plan.test_files)
    done = time.time()
    return {
        "precision_at_1": evaluation.precision_at_1,
        "correct": evaluation.correct,
        "examples": evaluation.examples,
        "global_step": evaluation.global_step,
        "saved_model_precision_at_1": saved_model_precision,
        "saved_model_dir": saved_model_dir,
        "generated": result.plan.test_files.generated,
        "ema": evaluation.ema,
        "towers": len(result.plan.devices),
        "train_dir": train_dir,
        "seconds": {
            "train": trained - start,
            "eval": evaluated - trained,
            "export": exported - evaluated,
            "check": done - exported,
            "total": done - start,
        },
    }


def folder_megabytes(path: str) -> float:
    """What `path` holds on disk, in MB (its files, recursively)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass  # removed while walking
    return total / 1e6


def main():
    refuse_cluster(os.environ.get("TF_CONFIG", ""))
    figures = run(options.given(), options.defaults())
    if "stopped" in figures:   # script_runner: "stopped by ...; rerun", status 128 + s
        logger.info("Training stopped before its last step: the run is unfinished, so "
                    "it is neither evaluated nor exported.")
        return figures["stopped"]
    seconds = figures["seconds"]
    run_config = run_folder.load(figures["train_dir"])
    print("\n".join([
        "",
        "CIFAR-10 example (%s data), model %s on %d tower(s), global batch %d:" % (
            "GENERATED" if figures["generated"] else "CIFAR-10", run_config.model,
            figures["towers"], run_config.global_batch_size),
        "  final test precision@1 = %.4f (%d/%d) at global step %d%s" % (
            figures["precision_at_1"], figures["correct"], figures["examples"],
            figures["global_step"], ", moving-average weights" if figures["ema"] else ""),
        "  SavedModel %s: precision@1 = %.4f when loaded back" % (
            figures["saved_model_dir"], figures["saved_model_precision_at_1"]),
        "  time: train %.0f s, eval %.0f s, export %.0f s, check %.0f s; %.0f s in all "
        "(process start included)" % (
            seconds["train"], seconds["eval"], seconds["export"], seconds["check"],
            time.time() - _PROCESS_START),
        "  run folder %s: %.0f MB (checkpoints, data, export; TensorBoard: tensorboard "
        "--logdir %s); remove it with rm -r %s" % (
            figures["train_dir"], folder_megabytes(figures["train_dir"]),
            figures["train_dir"], figures["train_dir"]),
    ]))
    sys.stdout.flush()


if __name__ == "__main__":
    command_line.define_script_flags(SCRIPT_FLAGS, MAIN_DEFAULTS)
    script_runner.start(main)
