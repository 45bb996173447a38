"""A trained KerasTower model out of its checkpoint: a SavedModel, or Keras' own weights file.

    tower.export_saved_model(result.checkpoint, "export/1")
    # serving_default: the model's inputs by name -> its outputs by name, inference mode
    tower.save_weights(result.checkpoint, "weights.h5")
    plain = make_model(); plain.load_weights("weights.h5")   # tf_keras, no towerlib

Each builds the model once more in a graph of its own
(KerasTower.inference_model: the model function, or a clone of the model
object's structure; a subclassed model object is refused), restores the checkpoint's values
(tower 0's, the plain Keras names) and writes. Nothing is written over: an
existing export folder or weights file is refused.
"""

import os

import tensorflow as tf

__all__ = ["export_saved_model", "save_weights"]


def _restored_model(tower, checkpoint, session):
    model = tower.inference_model()
    stored = {v.op.name: v for v in tf.compat.v1.global_variables()}
    weights = {w.op.name: stored.get(w.op.name, w) for w in model.weights}
    tf.compat.v1.train.Saver(var_list=weights).restore(session, checkpoint)
    return model


def _refuse_existing(path, what):
    if os.path.lexists(path):
        raise FileExistsError(f"{what}: {path} exists, and towerlib does not write over it. "
                              "Fix: another path, or remove it yourself.")


def _named(structure, names, kind):
    """{name: tensor} of a model's inputs or outputs (a tensor, a list, or a dict)."""
    if isinstance(structure, dict):
        return dict(structure)
    flat = list(structure) if isinstance(structure, (list, tuple)) else [structure]
    names = list(names) if names and len(names) == len(flat) else [
        f"{kind}_{i}" for i in range(len(flat))]
    return dict(zip(names, flat))


def export_saved_model(tower, checkpoint, export_dir):
    """Writes `tower`'s model with `checkpoint`'s weights as a SavedModel; returns export_dir.

    The 'serving_default' signature takes the model's inputs by their names
    (placeholders of their shapes and dtypes) and gives its outputs by name,
    computed with training=False (moving statistics, no dropout).
    """
    _refuse_existing(export_dir, "export_saved_model")
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        model = _restored_model(tower, checkpoint, session)
        inputs = {name: tf.compat.v1.placeholder(tensor.dtype, tensor.shape, name=name)
                  for name, tensor in _named(model.inputs, model.input_names, "input").items()}
        given = list(inputs.values())
        outputs = model(given[0] if len(given) == 1 else given, training=False)
        signature = tf.compat.v1.saved_model.predict_signature_def(
            inputs, _named(outputs, model.output_names, "output"))
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            session, [tf.compat.v1.saved_model.tag_constants.SERVING],
            signature_def_map={"serving_default": signature})
        builder.save()
    return export_dir


def save_weights(tower, checkpoint, path):
    """Writes `checkpoint`'s values as Keras' own weights file (model.save_weights(path)),
    which `load_weights` reads into a plain tf_keras model of the same structure."""
    _refuse_existing(path, "save_weights")
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        _restored_model(tower, checkpoint, session).save_weights(path)
    return path
