"""How batch norm treats the towers: one object per mode; the strings are shorthands.

    towerlib.build_train_graph(..., bn_mode="sync")          # or towerlib.BnMode.sync
    mode = resolve_bn_mode("sync")                           # BnMode.sync
    mode.normalizes_globally                                 # True: it needs the exchange
    mode.moving_statistics(layer_statistics)                 # tower 0's (global) statistics

Every decision that differs between the modes is a method or attribute of the
one type, BnMode, so no other module compares a mode with a string:

| | normalizes with | one moving-average update from | user UPDATE_OPS run |
|---|---|---|---|
| FIRST_TOWER | each tower's shard | tower 0's shard | tower 0's |
| ALL_TOWERS | each tower's shard | every tower's, pooled | every tower's |
| SYNC | the global batch | the global batch (tower 0's copy) | every tower's |

A mode is a str, its name, so a tower function that compares ctx.bn_mode
with a name, prints it or writes it to JSON keeps working. It is resolved once, at
the edge (the build's options, a TowerContext made by hand); the modules after it
take the member.
"""

import enum

__all__ = ["ALL_TOWERS", "BN_MODES", "BnMode", "FIRST_TOWER", "SYNC", "resolve_bn_mode"]


class BnMode(str, enum.Enum):
    """How batch norm treats the towers: a member, or its name, for `bn_mode=`.

        towerlib.build_train_graph(..., bn_mode=towerlib.BnMode.sync)   # = "sync"

    first_tower: tower 0's shard updates the moving statistics; all_towers: the
    pooled global batch does; sync: every tower also normalizes with the global
    batch's statistics (docs/batch_norm_modes.md). Members equal, hash and print
    as their names, so either spelling works everywhere.

    Attributes:
      normalizes_globally: a training layer normalizes with the whole global
        batch's statistics, which crosses between towers (and workers).
      pools_every_tower: the moving statistics take every tower's shard.
      promise: what the mode does, for messages (None: nothing foreign batch
        norm could break).
    """

    def __new__(cls, name, normalizes_globally, pools_every_tower, promise):
        member = str.__new__(cls, name)
        member._value_ = name
        member.normalizes_globally = normalizes_globally
        member.pools_every_tower = pools_every_tower
        member.promise = promise
        return member

    first_tower = ("first_tower", False, False, None)
    all_towers = ("all_towers", False, True,
                  "updates the moving statistics once a step from the pooled statistics "
                  "of the whole global batch")
    sync = ("sync", True, False,
            "normalizes every tower with the statistics of the whole global batch and "
            "updates the moving statistics from them")

    def __str__(self):
        return self.value

    def __repr__(self):  # as the name it was given as, in messages
        return repr(self.value)

    def __format__(self, spec):
        return format(self.value, spec)

    def exchanges(self, num_towers, peers=1):
        """Whether a training layer exchanges statistics on `num_towers` towers (and
        `peers` members of the reducer's group across workers)."""
        return self.normalizes_globally and max(num_towers, peers) > 1

    def moving_statistics(self, layer_statistics):
        """The BatchNormStatistics one step's moving-average update pools (several:
        pooled; with accumulation, every micro-batch of the towers used)."""
        if self.pools_every_tower:
            return list(layer_statistics)
        return [s for s in layer_statistics if s.tower_index == 0]

    def runs_update_ops_of(self, tower_context):
        """Whether tower `tower_context`'s own UPDATE_OPS run once per step."""
        return tower_context.is_first if self is BnMode.first_tower else True

    def check_replicas(self, num_replicas):
        """Raises ValueError when the mode cannot span `num_replicas` ps-path replicas:
        'sync' all-reduces among one worker's towers only."""
        if self.normalizes_globally and num_replicas > 1:
            raise ValueError(
                f"bn_mode='sync' cannot span the {num_replicas} workers of this "
                "cluster: its all-reduce runs among one worker's towers only, so each "
                "worker would normalize with its own shard of the global batch, not "
                "the whole batch. Use bn_mode='all_towers' (each worker normalizes per "
                "tower and updates the moving statistics from its whole worker batch) "
                "or 'first_tower'.")


BN_MODES = tuple(mode.value for mode in BnMode)
FIRST_TOWER, ALL_TOWERS, SYNC = BnMode.first_tower, BnMode.all_towers, BnMode.sync


def resolve_bn_mode(bn_mode):
    """The BnMode for a member or its name; ValueError otherwise.

    The one place a mode's name is read: the build's options resolve it once
    (towerlib.step.options), and every module after them takes the member.
    """
    if isinstance(bn_mode, BnMode):
        return bn_mode
    if not isinstance(bn_mode, str) or bn_mode not in BN_MODES:
        raise ValueError(
            f"Unknown bn_mode {bn_mode!r}. Fix: pick one of {', '.join(BN_MODES)}: "
            "'first_tower' updates the moving statistics from tower 0's shard, "
            "'all_towers' from the whole global batch, 'sync' also normalizes "
            "with the whole global batch's statistics.")
    return BnMode(bn_mode)
