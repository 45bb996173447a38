"""A small, deterministic, generated data set in the CIFAR-10 binary format.

Why: the example must run end to end where the real CIFAR-10 cannot be downloaded (CI, an
offline machine) and finish in minutes on a 2-core CPU, while still being a real learning
task for the same reader, augmentations, models and multi-tower training.

What: ten classes of textures and shapes (stripes in two orientations, checkerboard,
cross-hatch, rings, dots, disk, square outline, plus sign, smooth ramp), each drawn with a
random foreground and background colour, random scale, phase and position, and pixel noise.
Colours say nothing about the class, so no per-image constant (mean colour, brightness)
predicts it: a model has to see the shape. Every class survives the training augmentations
(translation by cropping, left-right flip, brightness, contrast, per-image standardization):
no class is the mirror image of another, and the shapes are drawn away from the border.

The files are the release's names and record layout (``data_batch_1..5.bin``,
``test_batch.bin`` under ``cifar-10-batches-bin/``), plus ``GENERATED_DATA.txt`` saying
they are generated and ``batches.meta.txt`` with the class names. The same ``seed``
gives byte-identical files.
"""

import os
import shutil
import tempfile
from typing import Tuple

import numpy as np

from examples.cifar10 import data

GENERATED_CLASS_NAMES = (
    "horizontal_stripes",
    "vertical_stripes",
    "checkerboard",
    "cross_hatch",
    "rings",
    "dots",
    "disk",
    "square_outline",
    "plus",
    "vertical_ramp",
)

DEFAULT_TRAIN_PER_FILE = 1000  # x5 files = 5000 training examples
DEFAULT_TEST_EXAMPLES = 1000
DEFAULT_SEED = 0

# Pixel noise and colour contrast on the 0..255 scale.
NOISE_STDDEV = 14.0
MIN_COLOUR_DISTANCE = 70.0

_COORDS = np.arange(data.IMAGE_SIZE, dtype=np.float64)
_Y, _X = np.meshgrid(_COORDS, _COORDS, indexing="ij")  # [32, 32] each, row y, column x


def _soft(z, sharpness=4.0):
    """Maps a signed field to a soft 0..1 mask (anti-aliased edges)."""
    return 0.5 + 0.5 * np.tanh(sharpness * z)


def _pattern_mask(label: int, rng: np.random.Generator) -> np.ndarray:
    """The foreground mask float64 [32, 32] in 0..1 of one random instance of ``label``."""
    period = rng.uniform(4.5, 8.0)
    phase = rng.uniform(0, 2 * np.pi)
    centre_y, centre_x = rng.uniform(12.5, 18.5, size=2)
    dy, dx = _Y - centre_y, _X - centre_x
    if label == 0:  # horizontal stripes
        return _soft(np.sin(2 * np.pi * _Y / period + phase))
    if label == 1:  # vertical stripes
        return _soft(np.sin(2 * np.pi * _X / period + phase))
    if label == 2:  # checkerboard
        return _soft(
            np.sin(2 * np.pi * _X / period + phase)
            * np.sin(2 * np.pi * _Y / period + rng.uniform(0, 2 * np.pi))
        )
    if label == 3:  # cross-hatch: thin lines along both diagonals (its own mirror image)
        lines_a = np.cos(2 * np.pi * (_X + _Y) / (period * 1.4) + phase)
        lines_b = np.cos(2 * np.pi * (_X - _Y) / (period * 1.4) + rng.uniform(0, 2 * np.pi))
        return _soft(np.maximum(lines_a, lines_b) - 0.7, sharpness=6.0)
    if label == 4:  # concentric rings
        return _soft(np.sin(2 * np.pi * np.hypot(dy, dx) / period + phase))
    if label == 5:  # dots on a grid
        dots = np.cos(2 * np.pi * _X / period + phase) * np.cos(
            2 * np.pi * _Y / period + rng.uniform(0, 2 * np.pi)
        )
        return _soft(dots - 0.55, sharpness=8.0)
    if label == 6:  # one filled disk
        radius = rng.uniform(6.0, 10.0)
        return _soft(radius - np.hypot(dy, dx), sharpness=1.5)
    if label == 7:  # square outline
        half_side = rng.uniform(6.0, 10.0)
        thickness = rng.uniform(1.5, 2.5)
        distance_to_edge = np.abs(np.maximum(np.abs(dy), np.abs(dx)) - half_side)
        return _soft(thickness / 2 - distance_to_edge, sharpness=2.0)
    if label == 8:  # plus sign
        arm = rng.uniform(7.0, 11.0)
        half_width = rng.uniform(1.2, 2.2)
        bar_h = np.minimum(half_width - np.abs(dy), arm - np.abs(dx))
        bar_v = np.minimum(half_width - np.abs(dx), arm - np.abs(dy))
        return _soft(np.maximum(bar_h, bar_v), sharpness=2.0)
    if label == 9:  # one smooth ramp from top to bottom (or bottom to top)
        ramp = (_Y - centre_y) / rng.uniform(5.0, 9.0)
        return _soft(ramp if rng.random() < 0.5 else -ramp, sharpness=1.0)
    raise ValueError("label must be in 0..9, got %d" % label)


def _colour_pair(rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Random background and foreground RGB colours at least MIN_COLOUR_DISTANCE apart."""
    while True:
        background, foreground = rng.uniform(0, 255, size=(2, 3))
        if np.linalg.norm(foreground - background) >= MIN_COLOUR_DISTANCE:
            return background, foreground


def make_examples(
    num_examples: int, rng: np.random.Generator
) -> Tuple[np.ndarray, np.ndarray]:
    """Draws ``num_examples`` balanced examples in a shuffled order.

    Returns:
      images: uint8 [num_examples, 32, 32, 3] (height, width, RGB).
      labels: uint8 [num_examples], each class num_examples // 10 or one more times.
    """
    labels = rng.permutation(np.arange(num_examples) % data.NUM_CLASSES).astype(np.uint8)
    images = np.empty(
        (num_examples, data.IMAGE_SIZE, data.IMAGE_SIZE, data.IMAGE_CHANNELS),
        dtype=np.uint8,
    )
    for i, label in enumerate(labels):
        mask = _pattern_mask(int(label), rng)[:, :, None]
        background, foreground = _colour_pair(rng)
        image = background + mask * (foreground - background)
        image += rng.normal(0.0, NOISE_STDDEV, size=image.shape)
        images[i] = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return images, labels


def _describe(seed: int, train_per_file: int, test_examples: int) -> str:
    return (
        "This folder holds GENERATED data in the CIFAR-10 binary format, written by\n"
        "examples/cifar10/generate.py; it is NOT the CIFAR-10 data set.\n"
        "seed=%d train_examples=%d (%d files x %d) test_examples=%d\n"
        "classes: %s\n"
        % (
            seed,
            train_per_file * len(data.TRAIN_FILES),
            len(data.TRAIN_FILES),
            train_per_file,
            test_examples,
            ", ".join(GENERATED_CLASS_NAMES),
        )
    )


def generate(
    data_dir: str,
    seed: int = DEFAULT_SEED,
    train_per_file: int = DEFAULT_TRAIN_PER_FILE,
    test_examples: int = DEFAULT_TEST_EXAMPLES,
    overwrite: bool = False,
) -> str:
    """Writes the generated data set to ``data_dir/cifar-10-batches-bin``; returns that path.

    The files are written into a temporary folder next to the destination which is renamed
    into place at the end, so an interrupted run leaves no half-written data set behind.
    Each file draws from its own generator seeded by (seed, file index), so the training
    files and the test file are independent samples and the output depends only on the
    arguments.

    Raises:
      FileExistsError: the destination exists and ``overwrite`` is False.
    """
    if train_per_file < 1 or test_examples < 1:
        raise ValueError("train_per_file and test_examples must be >= 1")
    os.makedirs(data_dir, exist_ok=True)
    destination = os.path.join(data_dir, data.BATCHES_DIR)
    if os.path.exists(destination) and not overwrite:
        raise FileExistsError("%r exists; pass overwrite=True to replace it." % destination)
    staging = tempfile.mkdtemp(dir=data_dir, prefix=".generating-")
    try:
        sizes = [train_per_file] * len(data.TRAIN_FILES) + [test_examples]
        for index, (name, size) in enumerate(
            zip(data.TRAIN_FILES + data.TEST_FILES, sizes, strict=True)
        ):
            rng = np.random.default_rng([seed, index])
            images, labels = make_examples(size, rng)
            data.write_records(os.path.join(staging, name), images, labels)
        with open(os.path.join(staging, "batches.meta.txt"), "w") as f:
            f.write("\n".join(GENERATED_CLASS_NAMES) + "\n")
        with open(os.path.join(staging, data.GENERATED_MARKER), "w") as f:
            f.write(_describe(seed, train_per_file, test_examples))
        if os.path.exists(destination):
            shutil.rmtree(destination)
        os.rename(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def ensure_generated(data_dir: str, **kwargs) -> str:
    """Returns ``data_dir/cifar-10-batches-bin``, generating it first if it is not there.

    An existing folder is reused only when it was generated (has the marker file); a folder
    with anything else in it is left alone and reported, never overwritten.
    """
    destination = os.path.join(data_dir, data.BATCHES_DIR)
    if os.path.isdir(destination):
        if not os.path.isfile(os.path.join(destination, data.GENERATED_MARKER)):
            raise data.DataError(
                "%r exists but was not written by the generator (no %s in it); not "
                "touching it. Fix: pass it as --data_dir to train on it, or choose another "
                "folder." % (destination, data.GENERATED_MARKER)
            )
        return destination
    return generate(data_dir, **kwargs)


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="folder to write cifar-10-batches-bin/ into")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--train_per_file", type=int, default=DEFAULT_TRAIN_PER_FILE)
    parser.add_argument("--test_examples", type=int, default=DEFAULT_TEST_EXAMPLES)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    path = generate(
        args.data_dir,
        seed=args.seed,
        train_per_file=args.train_per_file,
        test_examples=args.test_examples,
        overwrite=args.overwrite,
    )
    print("Wrote generated CIFAR-10-format data (not real CIFAR-10) to %s" % path)


if __name__ == "__main__":
    main()
