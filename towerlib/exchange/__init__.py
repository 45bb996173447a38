"""Cross-tower exchanges: the primitive under bn_mode='sync'.

    reducer = towerlib.exchange.CrossTowerReducer(devices)   # one per build
    total = reducer.sum(local_sums, tower_index=i, name="bn1")  # in tower i

The package, one job per module:

  reducer.py      CrossTowerReducer: sum / gather / gather_unordered per tower,
                  exact gradients through tf.custom_gradient
  ledger.py       pairing the towers' calls, checked at build time
  keys.py         collective group and instance keys, unique per graph
  packing.py      many same-dtype tensors into one exchange
  graph_hub.py    the 'graph' transport: one hub op per exchange (CPU default)
  collective_transport.py  the 'collective' transport: collective ops, NCCL on GPUs
  worker_hubs.py  across workers, several CPU towers each: a hub per worker, a gather between
  safety.py       fetch checks, run deadlines, timeouts explained
  choice.py       `exchange=`: GraphExchange, CollectiveExchange
  transport_rules.py  which transport by default, and each one's arguments
  group.py        WorkerGroup: this process's towers among every worker's

Both transports give every tower the same bits. The 'graph' transport cannot
wait for a tower that is not run; for collectives, the build-time pairing and
the run-time guards in safety.py keep a mistake from becoming a silent hang.
"""

from towerlib.exchange.choice import (
                                      EXCHANGE_NAMES,
                                      CollectiveExchange,
                                      ExchangeChoice,
                                      GraphExchange,
                                      resolve_exchange,
)
from towerlib.exchange.group import WorkerGroup
from towerlib.exchange.ledger import CollectiveMismatchError
from towerlib.exchange.reducer import TRANSPORTS, CrossTowerReducer
from towerlib.exchange.safety import (
                                      DEFAULT_TIMEOUT_SECONDS,
                                      CollectiveTimeoutError,
                                      PartialFetchError,
                                      bounded_session_config,
                                      check_fetches,
                                      explain_collective_errors,
                                      has_towerlib_collectives,
)

__all__ = [
    "CollectiveExchange", "EXCHANGE_NAMES", "ExchangeChoice", "GraphExchange",
    "resolve_exchange", "DEFAULT_TIMEOUT_SECONDS", "TRANSPORTS", "CollectiveMismatchError",
    "CollectiveTimeoutError", "CrossTowerReducer", "PartialFetchError",
    "bounded_session_config", "check_fetches", "explain_collective_errors",
    "has_towerlib_collectives", "WorkerGroup",
]
