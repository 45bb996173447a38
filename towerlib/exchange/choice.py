"""The `exchange=` option: how towers exchange statistics and gradients.

    exchange = towerlib.GraphExchange()                         # CPU default
    exchange = towerlib.CollectiveExchange(timeout_seconds=60)  # GPU default (NCCL)
    train = towerlib.build_train_graph(model, batch, optimizer, bn_mode="sync",
                                       exchange=exchange)

An exchange happens with bn_mode='sync' or update=Replicated() on more than
one tower. Left as None, the exchange is collectives (NCCL) when every tower
is a GPU and graph edges otherwise. 'graph' and 'collective' are shorthands.
"""

import dataclasses
import numbers
from typing import Optional

from towerlib.exchange import transport_rules
from towerlib.exchange.group import ONE_WORKER
from towerlib.exchange.reducer import CrossTowerReducer

__all__ = ["CollectiveExchange", "EXCHANGE_NAMES", "ExchangeChoice", "GraphExchange",
           "resolve_exchange"]

EXCHANGE_NAMES = ("graph", "collective")


class ExchangeChoice:
    """A transport for the cross-tower exchange; see the subclasses."""

    transport = ""
    timeout_seconds = None

    def reducer(self, devices, workers=ONE_WORKER) -> CrossTowerReducer:
        """The build's CrossTowerReducer over the tower `devices` (of every worker)."""
        return CrossTowerReducer(devices, timeout_seconds=self.timeout_seconds,
                                 transport=self.transport, workers=workers)


@dataclasses.dataclass(frozen=True)
class GraphExchange(ExchangeChoice):
    """One hub op per exchange on tower 0's device, fed by graph edges.

    It cannot wait for a tower: fetching one tower's result runs what it
    needs of the others (towerlib.exchange.graph_hub).
    """

    transport = "graph"


@dataclasses.dataclass(frozen=True)
class CollectiveExchange(ExchangeChoice):
    """TensorFlow's collective ops (NCCL between GPUs).

    Attributes:
      timeout_seconds: None (no per-op timeout), or a number > 0 of seconds
        after which a collective waiting for a member fails (costly on CPU;
        towerlib.exchange.CrossTowerReducer).
    """

    timeout_seconds: Optional[float] = None
    transport = "collective"

    def __post_init__(self):
        value = self.timeout_seconds
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, numbers.Real)
                                  or not value > 0 or value == float("inf")):
            raise ValueError(
                f"CollectiveExchange(timeout_seconds={value!r}) is not a timeout. Fix: a "
                "finite number of seconds > 0, or None for no per-op timeout.")
        if value is not None:
            object.__setattr__(self, "timeout_seconds", float(value))  # numpy numbers too


def resolve_exchange(exchange, devices=None, workers=ONE_WORKER) -> Optional[ExchangeChoice]:
    """The ExchangeChoice for `exchange`; None chooses by the tower `devices`.

    Args:
      exchange: an ExchangeChoice, 'graph', 'collective', or None.
      devices: the tower device strings (needed only when `exchange` is None).
      workers: a WorkerGroup; across workers only collectives can exchange.
    """
    if workers.spans_workers:
        if exchange is None or exchange == "collective":
            return CollectiveExchange()
        if isinstance(exchange, CollectiveExchange):
            return exchange
        raise ValueError(
            f"exchange={exchange!r} cannot span the {workers.num_workers} workers: a "
            "graph edge stays inside one worker's graph. Fix: "
            "towerlib.CollectiveExchange(timeout_seconds=...), or None.")
    if isinstance(exchange, ExchangeChoice):
        return exchange
    if exchange == "graph":
        return GraphExchange()
    if exchange == "collective":
        return CollectiveExchange()
    if exchange is None:
        if devices is None:
            return None
        return (CollectiveExchange() if transport_rules.default_transport(devices)
                == "collective" else GraphExchange())
    raise ValueError(
        f"exchange={exchange!r} is not an exchange. Fix: pass towerlib.GraphExchange() or "
        f"towerlib.CollectiveExchange(timeout_seconds=...), one of {EXCHANGE_NAMES}, "
        "or None to choose by device type.")
