"""towerlib.batchnorm."""
