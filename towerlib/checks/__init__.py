"""Checks that refuse bad input early, each naming the problem and the fix.

    towerlib.validate_config(num_towers=4, update="replicated", train_dir="/tmp/run")

The package, one job per module:

  problems.py         problems collected, not raised one at a time: ConfigError
  loop_options.py     run_training's options (train_dir, steps, checkpoints, traces)
  data_checks.py      input files and in-graph assertions on a batch
  tower_batch.py      the per-tower versus global batch confusion, named with numbers
  tower_isolation.py  no tower's loss may read another tower's examples
  graph_walk.py       walking a graph backwards, for the build-time checks
  run_time.py         run-time checks of a batch, reported in one line
  compute_dtypes.py   the towers compute in the build's precision, or it is said
"""
