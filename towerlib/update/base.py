"""The protocol every variable update follows, written down once.

A variable update decides where the towers' variables live and how their
gradients become one update. The user chooses it with a small immutable
option object (`towerlib.ParameterServer(...)`, `towerlib.Replicated(...)`);
`build_train_graph` calls its `build` once per training step graph and then
drives the returned `VariableUpdate` through these hooks, in this order:

    update = towerlib.Replicated(pack_bytes=1 << 20).build(num_towers=2, reducer=reducer)
    towers = build_towers(..., param_device=update.param_device,
                          variable_getter=update.variable_getter)   # 1. placement
    update.check_towers(towers)                                       # 2. refusals
    grads = [optimizer.compute_gradients(objective_i,
                                         update.tower_variables(var_list, i))
             for i, objective_i in enumerate(objectives)]          # 3. per tower
    combined = update.combine(grads)                                  # 4. one sum
    train_op = update.apply(optimizer, combined.apply_pairs, step)    # 5. one apply

With 2 towers and one weight `w`: a parameter server hands both towers `w`,
combine returns one pair [(g_0 + g_1, w)], and apply updates `w` once. Replicated
hands tower 1 its copy `replicated/tower_1/w`, combine all-reduces and returns
[[(g, w)], [(g, replicated/tower_1/w)]] with the same summed g in each, and one
apply op updates both copies alike.
"""

import abc
import dataclasses
from typing import Any, Callable, Dict, List, Optional

__all__ = ["CombinedGradients", "UpdateChoice", "VariableUpdate"]


@dataclasses.dataclass(frozen=True)
class CombinedGradients:
    """The gradients of one step after the towers' sum, per variable copy.

    Attributes:
      per_copy: one list of (gradient, variable) pairs per copy of the
        variables: one list for a parameter server, one per tower when
        replicated (tower 0's first, the variables in the same order).
      riders: per tower, the sums of the `riders` given to `combine`
        (carried by the gradients' exchange), else None.
      owned: with a sharded update, every variable's (its owner's summed
        gradient, tower 0's variable) once, in tower 0's order (what `reported`
        gives; `per_copy` then holds each tower's owned pairs only); else None.
    """

    per_copy: List[List[tuple]]
    riders: Optional[List[list]] = None
    owned: Optional[List[tuple]] = None

    @property
    def apply_pairs(self) -> List[tuple]:
        """Every copy's pairs, tower 0's first: what the one apply op updates."""
        return [pair for pairs in self.per_copy for pair in pairs]

    @property
    def reported(self) -> List[tuple]:
        """The step's (gradient, variable) pairs, once: tower 0's, or each owner's."""
        return self.per_copy[0] if self.owned is None else self.owned

    def map_pairs(self, transform: Callable[[List[tuple]], List[tuple]]):
        """The same structure with `transform` applied to each copy's pairs (sharded:
        to the owned pairs, which every copy's pairs are drawn from)."""
        if self.owned is None:
            return dataclasses.replace(
                self, per_copy=[transform(pairs) for pairs in self.per_copy])
        owned = transform(self.owned)
        new = {id(old): gradient for (old, _), (gradient, _) in zip(self.owned, owned)}
        return dataclasses.replace(
            self, owned=owned,
            per_copy=[[(new[id(g)], v) for g, v in pairs] for pairs in self.per_copy])


class VariableUpdate(abc.ABC):
    """One build's variable update: what the step builder asks of it.

    Attributes:
      name: 'parameter_server' or 'replicated' (TrainGraph.variable_update).
      param_device: where build_towers creates the variables: 'cpu', 'gpu',
        a device function, or None for each tower's own device.
    """

    name: str = ""
    param_device: Any = None
    # None: the towers share tower 0's variables as they are. Otherwise a
    # method tower_index -> the custom getter giving that tower its variables.
    variable_getter: Optional[Callable[[int], Callable]] = None

    def check_towers(self, towers) -> None:
        """Refuses what this update cannot train (called before any gradient exists)."""
        del towers

    @abc.abstractmethod
    def tower_variables(self, var_list, tower_index: int) -> list:
        """The variables tower `tower_index` differentiates: `var_list` or its copies."""

    @abc.abstractmethod
    def combine(self, tower_grads_and_vars, riders=None) -> CombinedGradients:
        """Sums the towers' gradients.

        Args:
          tower_grads_and_vars: one list of (gradient, variable) pairs per
            tower (with accumulation, summed over the tower's micro-batches);
            gradients already weighted by the examples' share of the global
            batch.
          riders: None, or per tower a list of float32 vectors to sum over the
            towers with the gradients (an update that exchanges gradients
            carries them in its buffers; see CombinedGradients.riders).
        """

    @abc.abstractmethod
    def apply(self, optimizer, pairs, global_step):
        """One op applying `pairs` (CombinedGradients.apply_pairs) and stepping `global_step`."""

    def sync_op(self):
        """An op making every copy equal tower 0's (after a restore), or None."""
        return None

    @property
    def copies(self) -> Dict[str, list]:
        """{tower 0's variable name: every tower's copy}; {} with one copy."""
        return {}


class UpdateChoice(abc.ABC):
    """A user's choice of variable update: immutable, checked when constructed."""

    name: str = ""

    @property
    @abc.abstractmethod
    def exchanges_gradients(self) -> bool:
        """Whether the towers' gradients cross between them through the exchange."""

    @abc.abstractmethod
    def build(self, num_towers: int, reducer) -> VariableUpdate:
        """This choice's VariableUpdate for one build (reducer: the exchange, or None)."""
