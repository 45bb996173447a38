"""What is measured: the configurations of one benchmark run, as plain data.

A configuration is one way of training one model on one tower count. The
configurations that share a (model, tower count) form a *group*; a group's
workers are alive together and are timed in alternation, so the ratios
between them (the point of the benchmark) compare runs made under the same
machine load. This module imports no TensorFlow: the coordinator plans and
reports without it.
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

# Kinds of training machinery.
TOWERLIB = "towerlib"
HANDWRITTEN = "handwritten"
MIRRORED = "mirrored"
SINGLE_DEVICE = "single_device"
KINDS = (TOWERLIB, HANDWRITTEN, MIRRORED, SINGLE_DEVICE)

# Where the global batch comes from.
SYNTHETIC_INPUT = "synthetic"      # one fixed in-memory batch, repeated
CIFAR_FILES_INPUT = "cifar_files"  # CIFAR-10 binary files + augmentation
INPUT_SOURCES = (SYNTHETIC_INPUT, CIFAR_FILES_INPUT)

# The peers besides towerlib's batch-norm modes; selectable with --peers.
PEER_HANDWRITTEN = "handwritten"
PEER_MIRRORED = "mirrored"
PEER_SINGLE_DEVICE = "single_device"
PEER_CIFAR_INPUT = "cifar_input"
PEERS = (PEER_HANDWRITTEN, PEER_MIRRORED, PEER_SINGLE_DEVICE, PEER_CIFAR_INPUT)

# Batch-norm mode of the configurations whose batch norm is not towerlib's
# choice (hand-written: first-tower UPDATE_OPS; the real-input run).
REFERENCE_BN_MODE = "first_tower"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One configuration: one machinery, one model, one tower count.

    Attributes:
      kind: one of KINDS.
      model: model name, e.g. 'convnet' or 'resnet20'.
      num_towers: the group's tower count (the one-device floor runs on one
        device whatever the group's count: it is timed in every group so that
        each ratio compares runs made under the same load).
      bn_mode: towerlib's batch-norm mode (towerlib only, else None).
      input_source: one of INPUT_SOURCES.
    """

    kind: str
    model: str
    num_towers: int
    bn_mode: Optional[str] = None
    input_source: str = SYNTHETIC_INPUT

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Unknown configuration kind {self.kind!r}; one of {KINDS}.")
        if self.input_source not in INPUT_SOURCES:
            raise ValueError(
                f"Unknown input source {self.input_source!r}; one of {INPUT_SOURCES}.")
        if self.num_towers < 1:
            raise ValueError(f"num_towers must be >= 1, got {self.num_towers}.")

    @property
    def label(self):
        """The row name in the report, e.g. 'towerlib first_tower'."""
        if self.kind == TOWERLIB:
            label = f"towerlib {self.bn_mode}"
            if self.input_source == CIFAR_FILES_INPUT:
                label += " + CIFAR files"
            return label
        return {
            HANDWRITTEN: "hand-written towers",
            MIRRORED: "MirroredStrategy",
            SINGLE_DEVICE: "one device, whole batch",
        }[self.kind]

    @property
    def key(self):
        """A unique, file-name-safe identifier within a run."""
        parts = [self.model, f"{self.num_towers}t", self.kind]
        if self.bn_mode:
            parts.append(self.bn_mode)
        if self.input_source != SYNTHETIC_INPUT:
            parts.append(self.input_source)
        return "-".join(parts)

    @property
    def times_construction(self):
        """Whether the report's graph-construction table shows this configuration.

        Only these are built `build_repeats` times (for a median); the others
        once, to keep the run short.
        """
        return self.kind == HANDWRITTEN or (
            self.kind == TOWERLIB and self.bn_mode == REFERENCE_BN_MODE
            and self.input_source == SYNTHETIC_INPUT)

    @property
    def devices_used(self):
        """How many devices this configuration trains on."""
        return 1 if self.kind == SINGLE_DEVICE else self.num_towers

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        return cls(**values)


def group_configs(model: str, num_towers: int, bn_modes: Sequence[str],
                  peers: Sequence[str]) -> List[BenchConfig]:
    """The configurations timed together for one (model, tower count)."""
    configs = [BenchConfig(TOWERLIB, model, num_towers, bn_mode=mode) for mode in bn_modes]
    if PEER_HANDWRITTEN in peers:
        configs.append(BenchConfig(HANDWRITTEN, model, num_towers))
    if PEER_MIRRORED in peers:
        configs.append(BenchConfig(MIRRORED, model, num_towers))
    if PEER_SINGLE_DEVICE in peers:
        configs.append(BenchConfig(SINGLE_DEVICE, model, num_towers))
    if PEER_CIFAR_INPUT in peers:
        configs.append(BenchConfig(TOWERLIB, model, num_towers, bn_mode=REFERENCE_BN_MODE,
                                   input_source=CIFAR_FILES_INPUT))
    return configs


def plan(models: Sequence[str], tower_counts: Sequence[int], bn_modes: Sequence[str],
         peers: Sequence[str]) -> List[Tuple[Tuple[str, int], List[BenchConfig]]]:
    """Every group of the run, in run order: [((model, towers), configs), ...]."""
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise ValueError(f"Unknown peers {unknown}; choose from {list(PEERS)}.")
    return [((model, towers), group_configs(model, towers, bn_modes, peers))
            for model in models for towers in tower_counts]


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every worker of a run shares (passed to each worker as JSON).

    Attributes:
      global_batch: examples per optimizer step, over all towers.
      warmup_steps: untimed steps after the graph is built.
      segment_warmup_steps: untimed steps before each timed segment (the
        worker was idle while the others ran; its caches are cold).
      learning_rate, momentum: the optimizer, the same for every configuration.
      weights_path: the .npz of initial weights, by variable name.
      data_dir: the CIFAR-10 binary folder for the real-input configuration.
      device_type: 'gpu' or 'cpu'.
      seed: seeds the synthetic batch and the input pipeline's shuffle.
      build_repeats: how many times the configurations in the construction
        table build their graph (each in a fresh tf.Graph), for a median;
        the last build is the one trained.
      mirrored_input: 'per_replica' (each replica reads its own shard,
        `distribute_datasets_from_function`) or 'distribute_dataset'
        (`experimental_distribute_dataset` of the global batch).
    """

    global_batch: int
    warmup_steps: int
    segment_warmup_steps: int
    learning_rate: float
    momentum: float
    weights_path: str
    data_dir: str
    device_type: str
    seed: int
    build_repeats: int
    mirrored_input: str

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        return cls(**values)
