"""The names towerlib.collective had before the exchange package; same objects.

New code imports from towerlib.exchange (cross-tower reductions) and
towerlib.hooks (CollectiveFetchCheckHook).
"""

from towerlib.exchange import (DEFAULT_TIMEOUT_SECONDS, TRANSPORTS, CollectiveMismatchError,
                               CollectiveTimeoutError, CrossTowerReducer, PartialFetchError,
                               bounded_session_config, check_fetches,
                               explain_collective_errors, has_towerlib_collectives)
from towerlib.hooks import CollectiveFetchCheckHook

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS", "TRANSPORTS", "CollectiveFetchCheckHook",
    "CollectiveMismatchError", "CollectiveTimeoutError", "CrossTowerReducer",
    "PartialFetchError", "bounded_session_config", "check_fetches",
    "explain_collective_errors", "has_towerlib_collectives",
]
