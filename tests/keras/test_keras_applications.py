"""tf_keras.applications.MobileNetV2 on 2 towers with replicated variables and
bn_mode='sync': its 52 layers' moving statistics move, and the evaluation graph agrees
with a SavedModel export.

One bn_mode, the one that pools statistics across towers: what each mode does to a
Keras batch norm's moving statistics is proven against tf_keras on one device in
tests/keras/test_keras_as_keras.py (all_towers and first_tower:
test_moving_statistics_are_keras_own_on_the_batch_the_mode_stands_for; sync:
test_sync_moving_statistics_are_keras_own_on_an_uneven_batch), and MobileNetV2 also
trains with sync, is evaluated and exported in tests/keras/test_keras_fine_tuning_lesson.py.
A MobileNetV2 run per mode took about 2 minutes each and proved nothing more."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib


def mobilenet():
    return tf_keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10,
                                             classifier_activation=None)


def loss(labels, logits):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def logit_columns(labels, logits):
    """Per example: 1/0 correct, and each class's logit (the evaluation averages them)."""
    correct = tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.int32)
    return {"correct": correct, **{f"logit_{c}": logits[:, c] for c in range(10)}}


@pytest.mark.slow
def test_mobilenet_v2_trains_evaluates_and_exports(tmp_path):
    bn_mode = "sync"
    rng = np.random.RandomState(0)
    images = rng.rand(12, 32, 32, 3).astype(np.float32)
    labels = rng.randint(0, 10, 12).astype(np.int32)
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(mobilenet, loss, metrics=logit_columns)
        batch = (tf.constant(images), tf.constant(labels))
        train = towerlib.build_train_graph(
            tower, batch, tf.compat.v1.train.MomentumOptimizer(0.01, 0.9), num_towers=2,
            bn_mode=bn_mode, update=towerlib.Replicated())
        evaluation = towerlib.build_eval_graph(tower, batch, num_towers=2,
                                               reuse_variables=True)
        moving = [v for v in tf.compat.v1.global_variables()
                  if v.op.name.endswith("moving_mean")]
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            before = session.run(moving)
            for _ in range(3):
                session.run(train.train_op)
            after = session.run(moving)
            session.run(evaluation.update_op)
            evaluated = session.run(evaluation.values)
            checkpoint = saver.save(session, str(tmp_path / "model.ckpt"))
    assert len(moving) == 52  # MobileNetV2's batch-norm layers
    assert all(np.abs(a - b).max() > 0 for a, b in zip(after, before))

    export_dir = str(tmp_path / "export")
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        model = towerlib.KerasTower(mobilenet, loss).model()
        x = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
        logits = model(x, training=False)
        tf.compat.v1.train.Saver(model.weights).restore(session, checkpoint)
        exported_moving = session.run([w for w in model.weights
                                       if w.op.name.endswith("moving_mean")])
        tf.compat.v1.saved_model.simple_save(session, export_dir, {"images": x},
                                             {"logits": logits})
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        exported = session.run(signature.outputs["logits"].name,
                               {signature.inputs["images"].name: images})
    assert evaluated["correct"] == pytest.approx(np.mean(exported.argmax(1) == labels))
    # Every class's mean logit: frozen or initial moving statistics would move these.
    np.testing.assert_allclose([evaluated[f"logit_{c}"] for c in range(10)],
                               exported.mean(axis=0), rtol=1e-4, atol=1e-5)
    assert sorted(np.concatenate(after).tolist()) == sorted(
        np.concatenate(exported_moving).tolist())
