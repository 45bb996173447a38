"""Batch norm across towers: 'first_tower', 'all_towers' or 'sync' statistics.

    h = towerlib.batch_norm(h, ctx, name="bn1")    # inside the tower function

The layer does not know the transport: a 'sync' layer asks the tower
context's cross-tower reducer (towerlib.exchange) for sums and gathers.

The package, one job per module:

  normalization.py  batch_norm, the moving statistics' one update per step, pooling
  moments.py        the statistics and gradient as plain functions (Chan's formula)
  worker_statistics.py  across workers: moving statistics every worker shares
  tower_layers.py   tf.compat.v1.layers.batch_normalization, tower-aware (one-line swap)
  foreign.py        finding batch norm that is not towerlib's, refused where it would
                    be wrong ('all_towers', 'sync')
"""
