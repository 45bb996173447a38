"""The model plug-in: one function that builds the architecture, for every configuration.

Every configuration (towerlib, the hand-written loop, MirroredStrategy, one
device) calls the same tower function `(inputs, ctx) -> loss`, built from
towerlib layers on `tf.compat.v1.get_variable`. What differs between them is
only the tower and gradient machinery around it, which is what the benchmark
compares. MirroredStrategy runs the very same function inside its
`tf.function`, with a custom getter handing it the strategy's variables
(`bench.mirrored`).

The models themselves come from the CIFAR-10 example (`examples.cifar10.models`:
the tutorial convnet and the CIFAR ResNets); the benchmark does not keep a copy.
"""

import dataclasses
import importlib
from typing import Any, Callable

MODEL_MODULE = "examples.cifar10.models"

# Augmentation of the real input pipeline when the model does not name one.
DEFAULT_AUGMENTATION = "resnet"


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded (the CIFAR-10 example's models are missing)."""


@dataclasses.dataclass(frozen=True)
class BenchModel:
    """A model the benchmark can train.

    Attributes:
      name: e.g. 'convnet', 'resnet20'.
      tower_fn: (inputs, ctx) -> loss, or a dict with a 'loss' entry; inputs
        are (images float32 [B, 32, 32, 3], labels int32 [B]).
      augmentation: the CIFAR-10 input pipeline's augmentation for this model.
    """

    name: str
    tower_fn: Callable[[Any, Any], Any]
    augmentation: str


def load_model(name: str) -> BenchModel:
    """The model called `name`, from the CIFAR-10 example.

    Raises:
      ModelUnavailable: the example's models module cannot be imported.
      ValueError: the module does not know `name`.
    """
    try:
        module = importlib.import_module(MODEL_MODULE)
    except ImportError as error:
        raise ModelUnavailable(
            f"Cannot import {MODEL_MODULE} ({error}); the benchmark trains the CIFAR-10 "
            "example's models. Run it from the repository root.") from error
    model = module.make_model(name)
    return BenchModel(
        name=name, tower_fn=model,
        augmentation=getattr(model, "default_augmentation", DEFAULT_AUGMENTATION))


def tower_loss(result):
    """The scalar loss from what a tower function returned (a tensor or a dict)."""
    if isinstance(result, dict):
        return result["loss"]
    return result
