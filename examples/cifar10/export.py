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
"""

import logging
import os
import shutil
import tempfile
from typing import Optional

import tensorflow as tf

import towerlib
from examples.cifar10 import config as config_lib
from examples.cifar10 import data, eval as eval_lib, input_pipeline, models, options
from examples.cifar10 import run_errors, script_runner

logger = logging.getLogger("cifar10")

INPUT_KEY = "images"
FLOAT_SIGNATURE = "serving_float"


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
    train_dir: str, export_dir: Optional[str] = None, checkpoint: Optional[str] = None
) -> str:
    """Exports ``checkpoint`` (default: the latest in train_dir); returns the SavedModel path.

    Raises:
      ConfigError: train_dir holds no run or no checkpoint.
    """
    run_config = config_lib.load(train_dir)
    # The newest checkpoint that reads back (as training restores it), not the state
    # file's latest, which may be torn.
    checkpoint = checkpoint or run_errors.restorable_checkpoint(train_dir)
    if not checkpoint:
        raise config_lib.ConfigError(
            "No checkpoint in --train_dir=%r to export. Fix: train first." % train_dir
        )
    global_step = int(tf.train.load_variable(checkpoint, "global_step"))
    export_dir = export_dir or os.path.join(train_dir, "export")
    os.makedirs(export_dir, exist_ok=True)
    destination = os.path.join(export_dir, str(global_step))
    staging_parent = tempfile.mkdtemp(dir=export_dir, prefix=".exporting-")
    staging = os.path.join(staging_parent, "saved_model")  # Builder wants a new folder
    try:
        with tf.Graph().as_default():
            model = run_config.make_model()
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
        if os.path.exists(destination):  # re-export of the same step: swap it whole
            old = os.path.join(staging_parent, "replaced")
            os.rename(destination, old)
        os.rename(staging, destination)
    finally:
        shutil.rmtree(staging_parent, ignore_errors=True)
    logger.info(
        "Exported global step %d%s to %s",
        global_step,
        " (moving-average weights)" if run_config.ema_decay else "",
        destination,
    )
    return destination


def main(argv):
    flags = options.FLAGS
    script_runner.run(argv, lambda: export(flags.train_dir, flags.export_dir or None))


if __name__ == "__main__":
    from absl import app
    from absl import flags as absl_flags

    options.define_export_flags()
    absl_flags.adopt_module_key_flags(options)  # list them in --help
    app.run(main)
