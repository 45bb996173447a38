"""towerlib.step."""
