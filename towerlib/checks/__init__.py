"""towerlib.checks."""
