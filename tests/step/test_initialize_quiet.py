"""TrainGraph.initialize changes no op a session already ran.

TensorFlow warns 'was changed by setting attribute after it was run by a session' when
an op that ran is grouped into a new op later, and says a future release makes it an
error; the README's replicated example printed it at every run.
"""

import os
import subprocess
import sys

import pytest

from tests import helpers

SCRIPT = r"""
import numpy as np
import tensorflow as tf
import towerlib
from tests import helpers

with tf.Graph().as_default():
    train = helpers.build_on_image_batch(4, tower_fn=helpers.conv_bn_model,
                                         optimizer_kind="momentum",
                                         update=towerlib.Replicated())
    with tf.compat.v1.Session(config=towerlib.session_config(4)) as session:
        train.initialize(session)
        session.run(train.train_op)
print("TRAINED")
"""


@pytest.mark.slow  # a fresh Python: the warning is TensorFlow's C++ log
def test_initialize_then_a_step_mutates_no_op_that_ran():
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
        cwd=helpers.REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0",
                                        PYTHONPATH=helpers.python_path()))
    assert "TRAINED" in completed.stdout, completed.stderr[-2000:]
    assert "changed by setting attribute" not in completed.stderr
