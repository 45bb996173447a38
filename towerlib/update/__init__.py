"""towerlib.update."""
