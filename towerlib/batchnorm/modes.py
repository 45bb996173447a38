"""How batch norm treats the towers: one object per mode; the strings are shorthands.

    towerlib.build_train_graph(..., bn_mode="sync")          # or towerlib.BnMode.sync
    mode = resolve_bn_mode("sync")                           # SYNC, a BatchNormMode
    mode.normalizes_globally                                 # True: it needs the exchange
    mode.moving_statistics(layer_statistics)                 # tower 0's (global) statistics

Every decision that differs between the modes is a method or attribute here,
so no other module compares a mode with a string:

| | normalizes with | one moving-average update from | user UPDATE_OPS run |
|---|---|---|---|
| FIRST_TOWER | each tower's shard | tower 0's shard | tower 0's |
| ALL_TOWERS | each tower's shard | every tower's, pooled | every tower's |
| SYNC | the global batch | the global batch (tower 0's copy) | every tower's |

A mode is a str, its name, so a tower function that compares ctx.bn_mode
with a name, prints it or writes it to JSON keeps working.
"""

import enum

__all__ = ["ALL_TOWERS", "BN_MODES", "BatchNormMode", "BnMode", "FIRST_TOWER", "SYNC",
           "resolve_bn_mode"]


class BnMode(str, enum.Enum):
    """How batch norm treats the towers; `bn_mode=` takes a member or its string.

        towerlib.build_train_graph(..., bn_mode=towerlib.BnMode.sync)   # = "sync"

    first_tower: tower 0's shard updates the moving statistics; all_towers: the
    pooled global batch does; sync: every tower also normalizes with the global
    batch's statistics (docs/batch_norm_modes.md). Members equal (and hash as)
    their strings, so either spelling works everywhere.
    """

    first_tower = "first_tower"
    all_towers = "all_towers"
    sync = "sync"

    def __str__(self):
        return self.value


BN_MODES = tuple(mode.value for mode in BnMode)


class BatchNormMode(str):
    """The protocol every mode follows (see the module docstring's table).

    A mode is a str (its name), so it compares, hashes, prints and serializes
    as the shorthand it was given as; towerlib itself asks its attributes.

    Attributes:
      normalizes_globally: a training layer normalizes with the whole global
        batch's statistics, which crosses between towers (and workers).
      pools_every_tower: the moving statistics take every tower's shard.
      promise: what the mode does, for messages (None: nothing foreign batch
        norm could break).
    """

    mode_name = ""
    normalizes_globally = False
    pools_every_tower = False
    promise = None

    def __new__(cls):
        return super().__new__(cls, cls.mode_name)

    def exchanges(self, num_towers, peers=1):
        """Whether a training layer exchanges statistics on `num_towers` towers (and
        `peers` members of the reducer's group across workers)."""
        return self.normalizes_globally and max(num_towers, peers) > 1

    def moving_statistics(self, layer_statistics):
        """The BatchNormStatistics one step's moving-average update pools (several:
        pooled; with accumulation, every micro-batch of the towers used)."""
        return [s for s in layer_statistics if s.tower_index == 0]

    def runs_update_ops_of(self, tower_context):
        """Whether tower `tower_context`'s own UPDATE_OPS run once per step."""
        del tower_context
        return True

    def check_replicas(self, num_replicas):
        """Raises ValueError when the mode cannot span `num_replicas` ps-path replicas."""
        del num_replicas


class _FirstTower(BatchNormMode):
    mode_name = "first_tower"

    def runs_update_ops_of(self, tower_context):
        return tower_context.is_first


class _AllTowers(BatchNormMode):
    mode_name = "all_towers"
    pools_every_tower = True
    promise = ("updates the moving statistics once a step from the pooled statistics of "
               "the whole global batch")

    def moving_statistics(self, layer_statistics):
        return list(layer_statistics)


class _Sync(BatchNormMode):
    mode_name = "sync"
    normalizes_globally = True
    promise = ("normalizes every tower with the statistics of the whole global batch and "
               "updates the moving statistics from them")

    def check_replicas(self, num_replicas):
        if num_replicas > 1:
            raise ValueError(
                f"bn_mode='sync' cannot span the {num_replicas} workers of this "
                "cluster: its all-reduce runs among one worker's towers only, so each "
                "worker would normalize with its own shard of the global batch, not "
                "the whole batch. Use bn_mode='all_towers' (each worker normalizes per "
                "tower and updates the moving statistics from its whole worker batch) "
                "or 'first_tower'.")


FIRST_TOWER, ALL_TOWERS, SYNC = _FirstTower(), _AllTowers(), _Sync()
_BY_NAME = {str(mode): mode for mode in (FIRST_TOWER, ALL_TOWERS, SYNC)}


def resolve_bn_mode(bn_mode):
    """The BatchNormMode for a mode, its name or a BnMode member; ValueError otherwise.

    The one place a mode's name is read.
    """
    if isinstance(bn_mode, BatchNormMode):
        return bn_mode
    name = bn_mode.value if isinstance(bn_mode, BnMode) else bn_mode
    if not isinstance(name, str) or name not in _BY_NAME:
        raise ValueError(
            f"Unknown bn_mode {bn_mode!r}. Fix: pick one of {', '.join(BN_MODES)}: "
            "'first_tower' updates the moving statistics from tower 0's shard, "
            "'all_towers' from the whole global batch, 'sync' also normalizes "
            "with the whole global batch's statistics.")
    return _BY_NAME[name]
