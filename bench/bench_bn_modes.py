"""Step time of the three batch-norm modes on a CIFAR ResNet-20.

    python bench/bench_bn_modes.py --towers=2,4,8 --repetitions=5

For each tower count, one training graph per bn_mode is built (each in its
own graph and Session, on virtual CPU devices unless GPUs are present), warmed
up, then timed in interleaved repetitions: every repetition times each mode
once, in a rotating order, so that load from other processes on the machine
spreads over the modes instead of landing on one. Reports the median seconds
per step of each mode and its ratio to first_tower.

The ResNet-20 (He et al. 2016, CIFAR variant: 3 stages of 3 basic blocks,
16/32/64 channels, 21 batch-norm layers with the projection shortcuts) is
built here from towerlib layers, since the CIFAR example's model is not in
the library. Data are random: only the time matters.

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import os
import statistics
import sys
import time

from absl import app
from absl import flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from towerlib import layers  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list('towers', ['2', '4', '8'], 'Tower counts to measure.')
flags.DEFINE_list('modes', ['first_tower', 'all_towers', 'sync'],
                  'Batch-norm modes; the first is the ratios\' baseline.')
flags.DEFINE_integer('global_batch', 128, 'Examples per step, over all towers.')
flags.DEFINE_integer('warmup_steps', 3, 'Untimed steps per graph first.')
flags.DEFINE_integer('repetitions', 5, 'Interleaved timed repetitions.')
flags.DEFINE_integer('steps_per_repetition', 4, 'Steps timed per repetition.')
flags.DEFINE_enum('param_device', 'cpu', ['cpu', 'gpu'], 'Where variables live.')
flags.DEFINE_integer('blocks_per_stage', 3, '3 gives ResNet-20 (6n + 2 layers).')


class CifarResNet(towerlib.TowerModel):
  """[B, 32, 32, 3] images, 10 classes; pre-2016 (post-activation) ResNet."""

  def __init__(self, blocks_per_stage=3):
    self.blocks_per_stage = blocks_per_stage

  def _conv_bn(self, x, ctx, filters, kernel, stride, name):
    x = layers.conv2d(x, filters, kernel, strides=stride, use_bias=False,
                      weight_decay=1e-4, name=name)
    return towerlib.batch_norm(x, ctx, name=name + '_bn', momentum=0.9,
                               epsilon=1e-5)

  def _block(self, x, ctx, filters, stride, name):
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
      shortcut = self._conv_bn(x, ctx, filters, 1, stride, name + '/project')
    h = tf.nn.relu(self._conv_bn(x, ctx, filters, 3, stride, name + '/conv1'))
    h = self._conv_bn(h, ctx, filters, 3, 1, name + '/conv2')
    return tf.nn.relu(h + shortcut)

  def build(self, inputs, ctx):
    images, labels = inputs
    h = tf.nn.relu(self._conv_bn(images, ctx, 16, 3, 1, 'stem'))
    for stage, filters in enumerate((16, 32, 64)):
      for block in range(self.blocks_per_stage):
        stride = 2 if stage > 0 and block == 0 else 1
        h = self._block(h, ctx, filters, stride, f'stage{stage}/block{block}')
    logits = layers.dense(layers.global_avg_pool2d(h), 10, name='logits')
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


class ModeRun:
  """One bn_mode's training graph and Session, ready to be stepped."""

  def __init__(self, num_towers, bn_mode):
    self.bn_mode = bn_mode
    self.graph = tf.Graph()
    rng = np.random.RandomState(0)
    with self.graph.as_default():
      images = tf.constant(
          rng.rand(FLAGS.global_batch, 32, 32, 3).astype(np.float32))
      labels = tf.constant(
          rng.randint(0, 10, FLAGS.global_batch).astype(np.int32))
      train = towerlib.build_train_graph(
          CifarResNet(FLAGS.blocks_per_stage), (images, labels),
          tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
          num_towers=num_towers, bn_mode=bn_mode,
          param_device=FLAGS.param_device, summaries=False)
      self.train_op = train.train_op
      self.session = tf.compat.v1.Session(
          config=towerlib.session_config(num_towers))
      self.session.run(tf.compat.v1.global_variables_initializer())
      self.collectives = sum(op.type.startswith('Collective')
                             for op in self.graph.get_operations())

  def seconds_per_step(self, steps):
    """(wall seconds, process CPU seconds) per step, averaged over `steps`."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
      self.session.run(self.train_op)
    return ((time.perf_counter() - wall) / steps,
            (time.process_time() - cpu) / steps)

  def close(self):
    self.session.close()


def measure(num_towers):
  """Median seconds per step of each mode at `num_towers`."""
  runs = [ModeRun(num_towers, mode) for mode in FLAGS.modes]
  try:
    for run in runs:
      run.seconds_per_step(FLAGS.warmup_steps)
    samples = {run.bn_mode: [] for run in runs}
    for repetition in range(FLAGS.repetitions):
      shift = repetition % len(runs)
      for run in runs[shift:] + runs[:shift]:
        samples[run.bn_mode].append(
            run.seconds_per_step(FLAGS.steps_per_repetition))
    collectives = {run.bn_mode: run.collectives for run in runs}
  finally:
    for run in runs:
      run.close()
  wall = {m: statistics.median(t[0] for t in times)
          for m, times in samples.items()}
  cpu = {m: statistics.median(t[1] for t in times)
         for m, times in samples.items()}
  return wall, cpu, collectives


def main(argv):
  del argv
  baseline = FLAGS.modes[0]
  print(f'CIFAR ResNet-{6 * FLAGS.blocks_per_stage + 2}, global batch '
        f'{FLAGS.global_batch}, param_device={FLAGS.param_device}, towers on '
        f'{towerlib.tower_devices(1)[0].split(":")[-2].split("/")[-1]} '
        f'devices, {os.cpu_count()} cores; median of {FLAGS.repetitions} '
        f'interleaved repetitions x {FLAGS.steps_per_repetition} steps; load '
        f'average at start {os.getloadavg()[0]:.1f}')
  header = ('| towers | ' + ' | '.join(f'{m} s/step' for m in FLAGS.modes) +
            ' | ' + ' | '.join(f'{m} / {baseline}' for m in FLAGS.modes[1:]) +
            ' | ' + ' | '.join(f'{m} / {baseline} (CPU time)'
                               for m in FLAGS.modes[1:]) +
            ' | collectives in the sync graph |')
  print(header)
  print('|' + ' --- |' * (header.count('|') - 1))
  for num_towers in (int(t) for t in FLAGS.towers):
    wall, cpu, collectives = measure(num_towers)
    cells = [f'{wall[m]:.3f}' for m in FLAGS.modes]
    cells += [f'{wall[m] / wall[baseline]:.2f}x' for m in FLAGS.modes[1:]]
    cells += [f'{cpu[m] / cpu[baseline]:.2f}x' for m in FLAGS.modes[1:]]
    cells.append(str(collectives.get('sync', 0)))
    print(f'| {num_towers} | ' + ' | '.join(cells) + ' |', flush=True)
  print(f'load average at end {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
  app.run(main)
