"""The `update=` option: an UpdateChoice object, or its name for the defaults.

    resolve_update("replicated")                  # Replicated()
    resolve_update(towerlib.ParameterServer("gpu"))  # itself
"""

from towerlib.update.base import UpdateChoice
from towerlib.update.parameter_server import ParameterServer
from towerlib.update.replicated import Replicated

__all__ = ["UPDATE_NAMES", "resolve_update"]

UPDATE_NAMES = ("parameter_server", "replicated")


def resolve_update(update):
    """The UpdateChoice for `update`: an UpdateChoice, or one of UPDATE_NAMES."""
    if isinstance(update, UpdateChoice):
        return update
    if update == "parameter_server":
        return ParameterServer()
    if update == "replicated":
        return Replicated()
    raise ValueError(
        f"update={update!r} is not a variable update. Fix: pass "
        f"towerlib.ParameterServer(...) or "
        f"towerlib.Replicated(...), or one of {UPDATE_NAMES} for their defaults.")
