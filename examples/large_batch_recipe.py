r"""The large-batch recipe of docs/large_batches.md, run from step 0 on the CIFAR example's data.

    python -m examples.large_batch_recipe                       # 8x the batch, momentum 0.9
    python -m examples.large_batch_recipe --bn_momentum=0.99    # Keras' default, to compare

A global batch of 1024 (8x the reference 128), the rate scaled linearly from 0.1 per 128
examples, warmed up over 5 epochs and decayed by half a cosine, LARS (momentum 0.9, weight
decay 5e-4), clipping by the global norm 5, batch norm synchronized over 2 towers (virtual
CPU devices), replicated variables. An evaluation of precision@1 on the test set every 8
steps keeps the best weights in <train_dir>/best and stops after 3 evaluations without an
improvement. The data is the example's built-in generated set (5,000 training and 1,000
test images, written into <train_dir>/generated_data), the model its ResNet-8.

The last line sums the run up; one run with the defaults printed (docs/large_batches.md)
    large-batch recipe: best precision 0.921 at step 128; stopped early at step 152 of 320;
    final training loss 0.104; bn momentum 0.9; best weights in /tmp/.../best
"""

import examples.cifar10  # noqa: F401  (first: keeps TensorFlow's start-up lines quiet)

# isort: split
import os
import tempfile

import tensorflow as tf
from absl import app, flags

import towerlib
from examples.cifar10 import data_source, input_pipeline, models, script_runner
from examples.cifar10.command_line import fail, parse_flags

flags.DEFINE_integer("global_batch", 1024, "Examples per step, over both towers.")
flags.DEFINE_integer("max_steps", 320, "The global step to stop at.")
# The rule (docs/large_batches.md): after n steps a share momentum**n of each moving
# average is still its initial value, so pick momentum <= 0.05**(1/n) for the first
# evaluation to trust. At 0.99 that share is 57% after 56 steps: evaluations at chance.
flags.DEFINE_float("bn_momentum", 0.9, "Batch norm's moving-average momentum.")
flags.DEFINE_string("model", "resnet8", "convnet or resnet<6n+2> (examples/cifar10/models.py).")
flags.DEFINE_string("train_dir", None, "A new or empty folder; none: a fresh temporary one.")
flags.DEFINE_integer("eval_every", 8, "Evaluate every this many steps.")
flags.DEFINE_integer("patience", 3, "Stop after this many evaluations without improvement.")
flags.DEFINE_integer("seed", 0, "The initial weights and the data order. The momentum "
                     "changes only the moving statistics, so two runs that differ in it "
                     "alone train alike and differ in their evaluations.")
FLAGS = flags.FLAGS

NUM_TOWERS = 2
REFERENCE_BATCH, BASE_RATE = 128, 0.1  # the rate of the example's small-batch runs
WARMUP_EPOCHS = 5


def check_flags():
    """One line and exit status 2 for a value that cannot work."""
    if FLAGS.global_batch < NUM_TOWERS or FLAGS.global_batch % NUM_TOWERS:
        fail(f"--global_batch={FLAGS.global_batch}: give a multiple of {NUM_TOWERS} "
             f"(the towers), e.g. 1024.")
    if not 0.0 <= FLAGS.bn_momentum < 1.0:
        fail(f"--bn_momentum={FLAGS.bn_momentum}: give a number in [0, 1), e.g. 0.9.")
    for name in ("max_steps", "eval_every", "patience"):
        if FLAGS[name].value < 1:
            fail(f"--{name}={FLAGS[name].value}: give an integer >= 1.")
    if FLAGS.eval_every > FLAGS.max_steps:
        fail(f"--eval_every={FLAGS.eval_every} is above --max_steps={FLAGS.max_steps}: "
             "no evaluation would run.")
    if not 0 <= FLAGS.seed < 2**32:
        fail(f"--seed={FLAGS.seed}: give an integer in 0..4294967295, e.g. 0.")
    if FLAGS.train_dir and os.path.exists(FLAGS.train_dir) and \
            not os.path.isdir(FLAGS.train_dir):
        fail(f"--train_dir={FLAGS.train_dir} is a file: give a new folder (or none for a "
             "temporary one).")
    if FLAGS.train_dir and os.path.isdir(FLAGS.train_dir) and os.listdir(FLAGS.train_dir):
        fail(f"--train_dir={FLAGS.train_dir} is not empty: the recipe runs from step 0; "
             "give a new folder (or none for a temporary one).")


def recipe_step(model, batch, examples_per_epoch):
    """docs/large_batches.md's recipe, as it reads there: a towerlib.TrainGraph."""
    schedules = towerlib.schedules
    steps, batch_size = FLAGS.max_steps, FLAGS.global_batch
    rate = schedules.LearningRate(
        schedules.linear_scaling(BASE_RATE, batch_size, reference_batch=REFERENCE_BATCH),
        decay=schedules.CosineDecay(total_steps=steps),
        warmup=schedules.Warmup(min(steps - 1, max(1, schedules.steps_for_epochs(
            WARMUP_EPOCHS, examples_per_epoch, batch_size)))))
    step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = towerlib.optimizers.LARSOptimizer(rate.tensor(step), momentum=0.9,
                                                  weight_decay=5e-4)
    return towerlib.build_train_graph(
        model, batch, optimizer, num_towers=NUM_TOWERS, update=towerlib.Replicated(),
        bn_mode="sync", clipping=towerlib.ClipByGlobalNorm(5.0), global_step=step)


def evaluation_on_test_set(model, test_files):
    """Precision@1 over every test image, on both towers, every --eval_every steps."""
    def precision(inputs, ctx):  # per example: 1 when predicted right; the mean is kept
        images, labels = inputs
        predicted = tf.argmax(model.logits(images, ctx), axis=1, output_type=tf.int32)
        return {"precision": tf.cast(tf.equal(predicted, labels), tf.float32)}

    test_batches = tf.compat.v1.data.make_initializable_iterator(
        input_pipeline.eval_dataset(test_files, batch_size=500))
    return towerlib.Evaluation(
        towerlib.build_eval_graph(precision, test_batches.get_next(), num_towers=NUM_TOWERS,
                                  reuse_variables=True),
        every_n_steps=FLAGS.eval_every, metric="precision",
        initializer=test_batches.initializer, patience=FLAGS.patience)


def summary_line(result, evaluation):
    """The run in one line: the best evaluation, its step, where the run stopped."""
    reader = tf.train.load_checkpoint(result.checkpoint)  # the state every checkpoint holds
    best = reader.get_tensor(evaluation.state.best.op.name)
    best_step = reader.get_tensor(evaluation.state.best_step.op.name)
    how = "stopped early" if result.stopped_early_at is not None else "stopped"
    return (f"large-batch recipe: best precision {best:.3f} at step {best_step}; {how} at "
            f"step {result.global_step} of {FLAGS.max_steps}; final training loss "
            f"{result.loss:.3f}; bn momentum {FLAGS.bn_momentum:g}; best weights in "
            f"{os.path.join(FLAGS.train_dir, 'best')}")


def main(argv):
    del argv
    check_flags()
    # No weight decay in the model: LARS applies the recipe's 5e-4 itself.
    try:
        model = models.make_model(FLAGS.model, weight_decay=0.0, bn_momentum=FLAGS.bn_momentum)
    except ValueError as error:  # an unknown --model: one line, with the known names
        fail(f"--model={FLAGS.model}: {error}")
    if not FLAGS.train_dir:
        FLAGS.train_dir = tempfile.mkdtemp(prefix="large_batch_recipe_")
        print(f"train_dir: {FLAGS.train_dir} (a new temporary folder; it stays after the "
              "run, about 30 MB: delete it, or give --train_dir)", flush=True)
    script_runner.configure_logging()
    _, train_files, test_files = data_source.prepare(None, FLAGS.train_dir)
    with tf.Graph().as_default():
        towerlib.seed_everything(FLAGS.seed)
        batch = input_pipeline.global_train_batches(
            train_files, FLAGS.global_batch, model.default_augmentation, seed=FLAGS.seed)
        train = recipe_step(model, batch, train_files.num_examples)
        evaluation = evaluation_on_test_set(model, test_files)
        result = towerlib.run_training(
            train, train_dir=FLAGS.train_dir, max_steps=FLAGS.max_steps,
            evaluation=evaluation, log_every_n_steps=FLAGS.eval_every,
            session_config=towerlib.session_config(NUM_TOWERS))
        print(summary_line(result, evaluation), flush=True)


if __name__ == "__main__":  # a bad flag: one line, exit status 2
    app.run(main, flags_parser=parse_flags)
