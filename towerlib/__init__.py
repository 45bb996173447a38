"""towerlib: one tower function, many devices, one optimizer step per global batch."""
