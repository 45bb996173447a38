"""Running the training step: a loop that survives faults and resumes exactly.

    result = towerlib.run_training(train, train_dir="/tmp/run", max_steps=1000)

The package, one job per module:

  trainer.py           run_training: the MonitoredSession loop, in phases
  validation.py        validate_config: the step's and the loop's options, every problem
  loop_hooks.py        the hooks of one run, in order, and the step facts they read
  hooks.py             the SessionRunHooks around a step (logging, checks, saving)
  evaluation_loop.py   Evaluation: evaluate every N steps, keep the best, stop early
  moving_statistics.py batch norm's moving statistics still mostly initial, said
  checkpoints.py       crash-safe checkpoints, restored from the newest complete one
  restore_point.py     where the chief's run starts: the checkpoint it restores, checked
  checkpoint_state.py  what a checkpoint is on disk: files, completeness, state file
  checkpoint_fit.py    a checkpoint of other shapes or dtypes refused before a session
  sessions.py          the chief's restoring sessions; recreation bounded
  durable_files.py     fsync, atomic rename and atomic text files
  stopping.py          SIGINT/SIGTERM finish the step, save and stop
  data_position.py     the input pipeline's position saved in every checkpoint
  global_batches.py    global_batch_input: the global batch fixed by the seed and the step
  determinism.py       seed_everything: a seeded run repeats
"""
