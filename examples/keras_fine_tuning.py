"""Lesson: fine-tune a tf_keras MobileNetV2 in two phases on 2 towers, then export it.

    pip install -e '.[keras]'      # towerlib and tf_keras
    python -m examples.keras_fine_tuning --train_dir /tmp/fine_tuning
    python examples/keras_fine_tuning.py --train_dir /tmp/fine_tuning   # the same

Keras' transfer-learning recipe, with towerlib doing the towers:

0. Phase 0: a base to start from. Nothing is downloaded here, so the lesson
   pretrains a MobileNetV2 itself on the generated data and saves Keras'
   weights file (base.h5). With network access, `weights="imagenet"` takes
   the same path: a model built with `weights=` (a hub name or a local .h5),
   or given `load_weights`/`set_weights`, starts training from those values.
1. Phase 1: `MobileNetV2(weights="base.h5")`, the base frozen
   (`layer.trainable = False`), only the classifier trains. towerlib trains
   what Keras would: the model's trainable_weights. The frozen batch norms
   run in inference mode; nothing of the base moves.
2. Phase 2: the top blocks unfrozen, a lower rate: a new run (its own
   train_dir) from phase 1's checkpoint: the classifier's optimizer slots
   are restored, the newly trained variables' start at zero, the global step
   goes on counting. (run_training(warm_start_from=) starts a new run from
   weights alone, without slots or step.)
3. Export: a SavedModel with a serving signature, and Keras' own weights
   file, which a plain tf_keras model loads with no towerlib at all.

The generated images are noise with a faint class signal: a few dozen
steps give a precision near chance (0.1), which the lesson says.
"""

import argparse
import os
import signal
import sys
import tempfile


def parse_flags(argv=None):
    """The lesson's flags, parsed before TensorFlow is imported (--help is instant)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_dir", required=True, help="a new folder for this run")
    parser.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(),
                                                           "towerlib_cifar10"))
    parser.add_argument("--phase_0_steps", type=int, default=40)
    parser.add_argument("--phase_1_steps", type=int, default=40)
    parser.add_argument("--phase_2_steps", type=int, default=40)
    return parser.parse_args(argv)


if __name__ == "__main__":
    FLAGS = parse_flags()
    if not __package__:  # run by path: the repository root holds the examples package
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402  (after the flags: --help needs no TensorFlow)
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import towerlib  # noqa: E402
from examples.cifar10 import data, generate, input_pipeline  # noqa: E402

TOP_FROM = "block_14_expand"  # phase 2 trains this layer and every one after it


CHANCE = 0.1  # ten classes


def mobilenet(trainable_from="predictions", weights=None):
    """MobileNetV2 for 32x32 images and 10 classes, every layer before `trainable_from` frozen;
    `weights`: None (random) or a Keras weights file it starts from."""
    model = tf_keras.applications.MobileNetV2(weights=weights, input_shape=(32, 32, 3),
                                              classes=10, classifier_activation=None)
    first = [layer.name for layer in model.layers].index(trainable_from)
    for layer in model.layers[:first]:
        layer.trainable = False
    return model


def cross_entropy(labels, logits):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def train_phase(make_model, train_files, *, train_dir, rate, max_steps, restore_from=None,
                num_towers=2):
    """One phase with run_training; returns (the KerasTower, its last checkpoint)."""
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(make_model, cross_entropy)
        batch = towerlib.saved_position_iterator(input_pipeline.train_dataset(
            train_files, 64, augmentation="resnet", seed=0, shuffle_buffer=1000)).get_next()
        train = towerlib.build_train_graph(
            tower, batch, tf.compat.v1.train.MomentumOptimizer(rate, 0.9),
            num_towers=num_towers, bn_mode="sync", update=towerlib.Replicated())
        result = towerlib.run_training(
            train, train_dir=train_dir, max_steps=max_steps, restore_from=restore_from,
            log_every_n_steps=10, session_config=towerlib.session_config(num_towers))
    if result.stop_signal:  # Ctrl-C or SIGTERM: the phase is unfinished, nothing follows
        sys.stderr.write(f"stopped by {result.stop_signal} at global step "
                         f"{result.global_step} of {max_steps} in {train_dir}; rerun the "
                         "same command to resume.\n")
        sys.exit(towerlib.cluster.exits.for_signal(signal.Signals[result.stop_signal]))
    return tower, result.checkpoint


def evaluate(tower, checkpoint, images, labels, num_towers=2):
    """The evaluation graph's precision and mean logit per class, over every tower."""
    def correct_and_logits(inputs, ctx):
        logits = tower.outputs(inputs[0], ctx)
        correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), inputs[1])
        return {"correct": tf.cast(correct, tf.int32),
                **{f"logit_{c}": logits[:, c] for c in range(10)}}

    with tf.Graph().as_default():
        evaluation = towerlib.build_eval_graph(
            correct_and_logits, (tf.constant(images), tf.constant(labels)),
            num_towers=num_towers)
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.local_variables_initializer())
            tf.compat.v1.train.Saver().restore(session, checkpoint)
            session.run(evaluation.update_op)
            values = session.run(evaluation.values)
    return values["correct"], np.array([values[f"logit_{c}"] for c in range(10)])


def serve(export_dir, images):
    """The SavedModel's 'serving_default' logits for `images`, in a session of its own."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        (image_input,) = signature.inputs.values()
        (logits_output,) = signature.outputs.values()
        return session.run(logits_output.name, {image_input.name: images})


def test_batch(data_dir, size=200):
    test_files = data.validate_split(data_dir, "test")
    images, labels = data.read_records_numpy(test_files.paths[0])
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        images = session.run(input_pipeline.preprocess_eval(images[:size]))
    return images, labels[:size].astype(np.int32)


def main(train_dir, data_dir, phase_0_steps=40, phase_1_steps=40, phase_2_steps=40):
    data_dir = os.path.dirname(generate.ensure_generated(data_dir))
    train_files = data.validate_split(data_dir, "train")
    base_tower, phase_0 = train_phase(
        lambda: mobilenet("Conv1"), train_files, train_dir=os.path.join(train_dir, "base"),
        rate=0.05, max_steps=phase_0_steps)
    base = base_tower.save_weights(phase_0, os.path.join(train_dir, "base.h5"))
    _, phase_1 = train_phase(lambda: mobilenet(weights=base), train_files,
                             train_dir=os.path.join(train_dir, "head"), rate=0.05,
                             max_steps=phase_1_steps)
    tower, phase_2 = train_phase(
        lambda: mobilenet(TOP_FROM), train_files, train_dir=os.path.join(train_dir, "top"),
        rate=0.005, max_steps=phase_1_steps + phase_2_steps, restore_from=phase_1)
    images, labels = test_batch(data_dir)
    precision, mean_logits = evaluate(tower, phase_2, images, labels)
    export_dir = tower.export_saved_model(phase_2, os.path.join(train_dir, "export"))
    weights_file = tower.save_weights(phase_2, os.path.join(train_dir, "weights.h5"))
    plain = mobilenet(TOP_FROM)  # tf_keras alone, eagerly: no towerlib
    plain.load_weights(weights_file)
    served = serve(export_dir, images)
    print(summary(precision, len(labels), phase_0_steps, served, mean_logits, images, labels))
    print(f"Base weights in {base}; SavedModel in {export_dir}; Keras weights in "
          f"{weights_file}")
    return dict(base=base, phase_0=phase_0, phase_1=phase_1, phase_2=phase_2,
                precision=precision, mean_logits=mean_logits, served=served,
                plain=plain(images, training=False).numpy())


def summary(precision, count, phase_0_steps, served, mean_logits, images, labels):
    """The result in one line: the precision against chance, and whether the export
    gives what the evaluation measured."""
    spread = 2 * np.sqrt(CHANCE * (1 - CHANCE) / count)  # two standard errors at chance
    judged = (f"chance level ({CHANCE:.1f}): the base had only {phase_0_steps} steps on "
              "generated data" if abs(precision - CHANCE) <= spread
              else f"above chance ({CHANCE:.1f})")
    matched = (np.isclose(np.mean(served.argmax(axis=1) == labels), precision)
               and np.allclose(served.mean(axis=0), mean_logits, rtol=1e-4, atol=1e-5))
    return (f"precision@1 = {precision:.3f} on {count} test examples, {judged}; the "
            f"SavedModel {'matches' if matched else 'does NOT match'} the evaluation "
            f"(precision and mean logits on the same {len(images)} images).")


if __name__ == "__main__":
    main(FLAGS.train_dir, FLAGS.data_dir, FLAGS.phase_0_steps, FLAGS.phase_1_steps,
         FLAGS.phase_2_steps)
