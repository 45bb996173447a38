"""Moved to towerlib.precision.guards (the build wraps the optimizer with it); kept while
run/trainer.py and run/hooks.py are edited elsewhere. Import towerlib.precision.guards."""

from towerlib.precision.guards import *  # noqa: F401,F403
from towerlib.precision.guards import NonFiniteError, guards_in  # noqa: F401
