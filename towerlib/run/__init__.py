"""towerlib.run."""
