"""towerlib.precision."""
