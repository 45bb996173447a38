r"""Export a trained CIFAR-10 model as a SavedModel for inference.

    python -m examples.cifar10.export --train_dir=/tmp/cifar10_train [--export_dir=...]

Writes <export_dir>/<global step>/ (default export_dir: <train_dir>/export), loadable in a
fresh process with ``tf.saved_model.load`` (or TF Serving). Two signatures:

- ``serving_default``: images uint8 [N, 32, 32, 3] (RGB, as decoded from a PNG);
- ``serving_float``: images float32 [N, 32, 32, 3] on the same 0..255 scale;

both returning ``logits`` float32 [N, 10], ``probabilities`` float32 [N, 10] and
``classes`` int64 [N]. The graph holds the preprocessing (per-image standardization) and
one inference tower (batch norm on its moving statistics); the weights are the moving
averages when the run kept them. The SavedModel is written to a temporary folder and
renamed into place, so a half-written export never looks like a finished one.

An existing <export_dir>/<step> is replaced only when it holds nothing but a SavedModel's
files (an earlier export of that step); a folder with anything else in it is refused
(--overwrite replaces it anyway), so that no file this script did not write is deleted.
"""

from examples.cifar10 import command_line, options

SCRIPT_FLAGS = options.EXPORT_FLAGS
# --help and a bad flag answer here, from the flag tables, before TensorFlow loads.
command_line.parse_flags_before_tensorflow(__name__, SCRIPT_FLAGS)

import fnmatch  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from typing import List, Optional  # noqa: E402

import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from examples.cifar10 import data, input_pipeline, models, run_folder, script_runner  # noqa: E402  # noqa: E402
from examples.cifar10 import eval as eval_lib

logger = logging.getLogger("cifar10")

INPUT_KEY = "images"
FLOAT_SIGNATURE = "serving_float"
# The files of a SavedModel as tf.compat.v1.saved_model.Builder writes it (no assets).
SAVED_MODEL_FILES = ("saved_model.pb", "fingerprint.pb", "variables/variables.index",
                     "variables/variables.data-?????-of-?????")


def foreign_files(folder: str) -> List[str]:
    """The files and folders under `folder` that are no part of a SavedModel."""
    found = []
    for root, dirs, files in os.walk(folder):
        relative = os.path.relpath(root, folder)
        for name in dirs:
            if os.path.normpath(os.path.join(relative, name)) != "variables":
                found.append(os.path.normpath(os.path.join(relative, name)) + "/")
        dirs[:] = [d for d in dirs if d == "variables" and relative == "."]
        for name in files:
            path = os.path.normpath(os.path.join(relative, name))
            if not any(fnmatch.fnmatchcase(path, p) for p in SAVED_MODEL_FILES):
                found.append(path)
    return sorted(found)


def check_export_dir(export_dir: str, given: bool) -> None:
    """Refuses an export folder that is a file or cannot be written (a read-only run
    folder), before anything is built. towerlib's probe tries to write."""
    try:
        towerlib.validate_config(train_dir=export_dir)
    except towerlib.ConfigError as error:
        raise options.flag_error(
            "export_dir", export_dir if given else "%s (the default)" % export_dir,
            error.problems[0].problem,
            "a folder this user can write, e.g. --export_dir=/tmp/cifar10_export.") from None


def check_replaceable(destination: str, overwrite: bool) -> None:
    """Refuses to replace a folder that holds files this script did not write."""
    if not os.path.exists(destination) or overwrite:
        return
    if not os.path.isdir(destination):
        raise options.FlagError(
            "%s exists and is not a folder; not replacing it. Fix: move it away, choose "
            "another --export_dir, or pass --overwrite." % destination)
    foreign = foreign_files(destination)
    if foreign:
        raise options.FlagError(
            "%s exists and holds files that are no part of an export of this script (%s); "
            "not deleting them. Fix: another --export_dir, or --overwrite to replace the "
            "folder whole." % (destination, ", ".join(foreign[:3])
                               + (", ..." if len(foreign) > 3 else "")))


def _outputs(model, images, reuse):
    """images (any real dtype) [N, 32, 32, 3] -> the signature's output tensors."""
    standardized = input_pipeline.preprocess_eval(images)  # per image, also on a batch
    logits = models.inference_logits(model, standardized, reuse=reuse)
    return {
        "logits": logits,
        "probabilities": tf.nn.softmax(logits),
        "classes": tf.argmax(logits, axis=1),
    }


def export(
    train_dir: str,
    export_dir: Optional[str] = None,
    checkpoint: Optional[str] = None,
    overwrite: bool = False,
) -> str:
    """Exports ``checkpoint`` (default: the latest in train_dir); returns the SavedModel path.

    Raises:
      FlagError: train_dir holds no run or no checkpoint; export_dir cannot be written;
        <export_dir>/<step> holds files of another origin (unless ``overwrite``).
    """
    run_config = run_folder.load(train_dir)
    # The newest checkpoint that reads back (as training restores it), not the state
    # file's latest, which may be torn.
    checkpoint = checkpoint or run_folder.restorable_checkpoint(train_dir)
    if not checkpoint:
        raise options.FlagError(
            "No checkpoint in --train_dir=%r to export. Fix: train first." % train_dir
        )
    global_step = int(tf.train.load_variable(checkpoint, "global_step"))
    check_export_dir(export_dir or os.path.join(train_dir, "export"), bool(export_dir))
    export_dir = export_dir or os.path.join(train_dir, "export")
    destination = os.path.join(export_dir, str(global_step))
    check_replaceable(destination, overwrite)
    # One warning line when batch norm's moving statistics are still mostly initial.
    towerlib.check_moving_statistics(checkpoint, run_config.bn_momentum)
    os.makedirs(export_dir, exist_ok=True)
    staging_parent = tempfile.mkdtemp(dir=export_dir, prefix=".exporting-")
    staging = os.path.join(staging_parent, "saved_model")  # Builder wants a new folder
    try:
        with tf.Graph().as_default():
            model = models.make_model(
                run_config.model, run_config.weight_decay, run_config.bn_momentum)
            shape = [None, data.IMAGE_SIZE, data.IMAGE_SIZE, data.IMAGE_CHANNELS]
            uint8_images = tf.compat.v1.placeholder(tf.uint8, shape, name="images_uint8")
            float_images = tf.compat.v1.placeholder(tf.float32, shape, name="images_float")
            uint8_outputs = _outputs(model, uint8_images, reuse=False)
            float_outputs = _outputs(model, float_images, reuse=True)
            saver = eval_lib.restore_saver(run_config)
            build = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def
            signatures = {
                tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: build(
                    {INPUT_KEY: uint8_images}, uint8_outputs
                ),
                FLOAT_SIGNATURE: build({INPUT_KEY: float_images}, float_outputs),
            }
            with tf.compat.v1.Session(config=towerlib.session_config(1)) as session:
                saver.restore(session, checkpoint)
                builder = tf.compat.v1.saved_model.Builder(staging)
                builder.add_meta_graph_and_variables(
                    session,
                    [tf.compat.v1.saved_model.tag_constants.SERVING],
                    signature_def_map=signatures,
                    strip_default_attrs=True,
                )
                builder.save()
        if os.path.exists(destination):  # an earlier export of this step (or --overwrite)
            check_replaceable(destination, overwrite)  # again: it may have changed since
            os.rename(destination, os.path.join(staging_parent, "replaced"))
        os.rename(staging, destination)
    finally:
        shutil.rmtree(staging_parent, ignore_errors=True)
    _record_in_run(train_dir, destination)
    logger.info(
        "Exported global step %d%s to %s",
        global_step,
        " (moving-average weights)" if run_config.ema_decay else "",
        destination,
    )
    return destination


def _record_in_run(train_dir: str, destination: str) -> None:
    """Records an export inside the run folder as the run's (--overwrite_train_dir deletes
    recorded exports only, never a user's version folder)."""
    relative = os.path.relpath(os.path.realpath(destination), os.path.realpath(train_dir))
    if not relative.startswith(os.pardir):
        run_folder.record_written(train_dir, [relative])


def main():
    flags = options.FLAGS
    export(flags.train_dir, flags.export_dir or None, overwrite=flags.overwrite)


if __name__ == "__main__":
    command_line.define_script_flags(SCRIPT_FLAGS)
    script_runner.start(main)
