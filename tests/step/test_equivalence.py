"""N towers on a global batch == one device on the same batch (invariant 1)."""

import numpy as np
import pytest

from tests import helpers

TOLERANCE = 1e-5


@pytest.mark.parametrize("optimizer_kind", ["sgd", "momentum"])
@pytest.mark.parametrize("global_batch", [12, 10])
@pytest.mark.parametrize("num_towers", [1, 2, 3, 4])
def test_conv_dense_model_matches_one_device(num_towers, global_batch, optimizer_kind):
    batch = helpers.image_batch(global_batch)
    reference = helpers.run_reference(helpers.conv_dense_model, batch, optimizer_kind)
    towers, _, step = helpers.run_towers(
        helpers.conv_dense_model, batch, optimizer_kind, num_towers)
    assert step == 5
    assert helpers.max_abs_difference(towers, reference) <= TOLERANCE
    # The run really trained: the weights moved away from the start.
    start = helpers.initial_values_like(reference)
    assert helpers.max_abs_difference(
        {k: v for k, v in reference.items() if k in start}, start) > 1e-3


@pytest.mark.parametrize("num_towers", [1, 2, 3, 4])
def test_sparse_embedding_model_matches_one_device(num_towers):
    batch = helpers.id_batch(10)
    reference = helpers.run_reference(helpers.embedding_model, batch, "momentum")
    towers, train, _ = helpers.run_towers(
        helpers.embedding_model, batch, "momentum", num_towers)
    assert helpers.max_abs_difference(towers, reference) <= TOLERANCE
    table_grads = [g for g, v in train.grads_and_vars if "embed" in v.op.name]
    assert len(table_grads) == 1
    assert type(table_grads[0]).__name__ == "IndexedSlices"


@pytest.mark.parametrize("num_towers", [2, 3])
def test_dynamic_batch_size_matches_one_device(num_towers):
    """Placeholders of unknown batch size, 11 examples fed: split at run time."""
    batch = helpers.image_batch(11, seed=3)
    reference = helpers.run_reference(helpers.conv_dense_model, batch, "momentum")
    towers, _, _ = helpers.run_towers(
        helpers.conv_dense_model, batch, "momentum", num_towers, feed=True)
    assert helpers.max_abs_difference(towers, reference) <= TOLERANCE


def test_per_tower_input_function_matches_one_device():
    """Each tower reads its own slice: same as the whole batch at once."""
    import tensorflow as tf
    batch = helpers.image_batch(9, seed=5)
    reference = helpers.run_reference(helpers.conv_dense_model, batch, "sgd")
    bounds = [(0, 4), (4, 7), (7, 9)]  # unequal per-tower batches

    def input_fn(ctx):
        start, stop = bounds[ctx.index]
        return tuple(tf.constant(x[start:stop]) for x in batch)

    towers, _, _ = helpers.run_towers(
        helpers.conv_dense_model, batch, "sgd", 3, inputs_override=input_fn)
    assert helpers.max_abs_difference(towers, reference) <= TOLERANCE


@pytest.mark.parametrize("param_device", ["cpu", "gpu"])
def test_parameter_device_does_not_change_the_result(param_device):
    batch = helpers.image_batch(8, seed=7)
    reference = helpers.run_reference(helpers.conv_dense_model, batch, "momentum")
    towers, _, _ = helpers.run_towers(
        helpers.conv_dense_model, batch, "momentum", 4, param_device=param_device)
    assert helpers.max_abs_difference(towers, reference) <= TOLERANCE
    assert np.isfinite(list(towers.values())[0]).all()
