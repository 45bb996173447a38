"""A user's own script with run_training and an Evaluation, at TensorFlow's default log
level (no TF_CPP_MIN_LOG_LEVEL, as a user's shell has), prints no TensorFlow log line per
evaluation.

Each evaluation reads its input to the end. When that end stopped a run that the towers'
devices were part of, TensorFlow logged every receive the run abandoned ("Local
rendezvous recv item cancelled", several per evaluation) and that it was aborting.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A TensorFlow C++ log line: severity, date, time (seconds since the epoch until absl
# initializes its log), thread, file:line].
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w.]+:\d+\]")

USER_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    import tensorflow as tf
    import towerlib

    def tower(inputs, ctx):
        x, y = inputs
        w = tf.compat.v1.get_variable("w", [4, 1])
        return tf.reduce_mean(tf.square(tf.matmul(x, w)[:, 0] - y))

    def metric(inputs, ctx):
        x, y = inputs
        w = tf.compat.v1.get_variable("w", [4, 1])
        return {"squared_error": tf.square(tf.matmul(x, w)[:, 0] - y)}

    x = np.random.RandomState(0).randn(64, 4).astype(np.float32)
    y = x.sum(axis=1)
    with tf.Graph().as_default():
        batches = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8))
        train = towerlib.build_train_graph(
            tower, batches.get_next(), tf.compat.v1.train.GradientDescentOptimizer(0.05),
            num_towers=2)
        test = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(10))   # 7 batches, uneven
        evaluation = towerlib.Evaluation(
            towerlib.build_eval_graph(metric, test.get_next(), num_towers=2,
                                      reuse_variables=True),
            every_n_steps=3, metric="squared_error", higher_is_better=False,
            initializer=test.initializer)
        towerlib.run_training(train, train_dir=sys.argv[1], max_steps=12,
                              evaluation=evaluation)
''')


@pytest.mark.slow
def test_no_tensorflow_log_line_per_evaluation(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
    environ["PYTHONPATH"] = REPO_ROOT + os.pathsep + environ.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "run")],
                            env=environ, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    evaluations = [i for i, line in enumerate(lines) if re.search(r"step \d+: evaluation ",
                                                                   line)]
    assert len(evaluations) == 4, result.stderr[-3000:]    # steps 3, 6, 9, 12
    # From the checkpoint of step 0 (after TensorFlow's start-up lines) to the end.
    start = next(i for i, line in enumerate(lines) if "Saving checkpoint for step 0" in line)
    tensorflow_lines = [line for line in lines[start:] if TF_LOG_LINE.match(line)]
    assert tensorflow_lines == [], "\n".join(tensorflow_lines[:12])
