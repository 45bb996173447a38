"""How the towers' gradients reach the variables: one small class per way.

    train = towerlib.build_train_graph(model, batch, optimizer,
                                       update=towerlib.Replicated(pack_bytes=1 << 20))

The package, one job per module:

  base.py              the protocol every update follows (VariableUpdate), written once
  parameter_server.py  ParameterServer: one copy of every variable, gradients summed there
  replicated.py        Replicated: a copy per tower, gradients all-reduced
  sharded.py           Replicated(shard_update=True): each tower updates 1/N of the weights
  holdings.py          replica_bytes: the weights, slots and gradients each device holds
  copies.py            the replicated copies: names, getters, slots, sync after restore
  allreduce.py         the gradients' all-reduce: packing, sparse gathers, wire dtype
  broadcast.py         across workers: every copy set to the chief's values at start
  aggregation.py       summing per-tower gradients on a variable's device
  choice.py            `update=`: an object, or its name for the defaults

Both ways compute the same update, one optimizer step on the mean loss of
the global batch; they differ in what crosses between devices each step.
"""

from towerlib.update.base import CombinedGradients, UpdateChoice, VariableUpdate
from towerlib.update.choice import UPDATE_NAMES, resolve_update
from towerlib.update.holdings import replica_bytes
from towerlib.update.parameter_server import ParameterServer
from towerlib.update.replicated import DEFAULT_PACK_BYTES, Replicated

__all__ = ["CombinedGradients", "DEFAULT_PACK_BYTES", "ParameterServer", "Replicated",
           "UPDATE_NAMES", "UpdateChoice", "VariableUpdate", "replica_bytes",
           "resolve_update"]
