"""Side-by-side training-step benchmarks: towerlib against what users would otherwise write.

One entry point, `python -m bench.run`, times the same model, from the same
weights, on the same devices and global batch, under:

- towerlib (`build_train_graph`), once per batch-norm mode;
- a classic hand-written tower loop (`bench.handwritten`), the overhead baseline;
- `tf.distribute.MirroredStrategy` with a `tf.function` step (`bench.mirrored`),
  the modern alternative;
- one device on the whole global batch (`bench.graph_trainers`), the floor on a
  machine where the towers share the same cores;
- towerlib fed by the real CIFAR-10 input pipeline instead of an in-memory batch.

Every configuration runs in its own worker process (`bench.worker`), so that
its peak memory is its own and MirroredStrategy can configure its devices
before TensorFlow starts. The coordinator (`bench.coordinator`) keeps the
workers of one (model, tower count) group alive and alternates between them
within each repetition, so that load from other programs hits every
configuration alike.
"""
