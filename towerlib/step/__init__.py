"""Building the training step: one tower function, many devices, one update.

    train = towerlib.build_train_graph(model, (images, labels), optimizer, num_towers=4)

The package, one job per module:

  build.py        build_train_graph: the orchestration, top to bottom
  options.py      every build option checked once and resolved to its object
  objective.py    the weighted objective: tower shares, regularization once
  across_workers.py  the step across workers: sums, riders, statistics, broadcast
  loss_terms.py   the TF 1 'losses' convention: weight decay inside a tower's loss
  towers.py       the tower function built once per device, variables shared
  context.py      TowerContext (passed explicitly) and TowerRecords
  accumulation.py micro-batches: the split of one step's global batch, per tower
  micro_loop.py   accumulation: the towers built once, run k times in a loop
  micro_state.py  values kept across micro-batches, in step-local variables
  apply.py        the one apply, under the chosen batch-norm updates, and the EMA
  train_graph.py  TrainGraph, what the build returns; ema_restore_map
  evaluation.py   build_eval_graph: metrics on every tower, exact over uneven shards
  devices.py      tower devices, virtual CPUs, where shared variables live
  inputs.py       splitting a global batch over the towers
  summaries.py    tower-aware scalar summaries
"""
