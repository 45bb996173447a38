"""The CIFAR-10 evaluation on several towers: the same correct count as on one device,
the --num_towers and --eval_batch_size errors, and the scripts' quiet TensorFlow start-up.

The test set has 20 examples and the batches 8: batches of 8, 8 and 4, none of which
divides over 3 towers evenly (3 + 3 + 2, 2 + 1 + 1), so an evaluation that averaged the
towers' precisions instead of summing their counts would show here.
"""

import os
import re
import subprocess
import sys
import types

import pytest

from examples.cifar10 import eval as eval_lib
from examples.cifar10 import generate, job, options, quiet_tensorflow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_EXAMPLES = 20
EVAL_BATCH = 8
TRAINED_TOWERS = 2


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """resnet8 trained for a few steps on 2 CPU towers, with a weight EMA, on a small
    generated data set (200 training and 20 test examples)."""
    folder = tmp_path_factory.mktemp("eval_towers")
    data_dir = str(folder / "data")
    generate.generate(data_dir, train_per_file=40, test_examples=TEST_EXAMPLES)
    config = dict(  # the train flags given
        train_dir=str(folder / "run"),
        data_dir=data_dir,
        model="resnet8",
        num_towers=TRAINED_TOWERS,
        device_type="cpu",
        global_batch_size=20,
        learning_rate=0.05,
        bn_momentum=0.9,
        ema_decay=0.9,
        max_steps=30,
        seed=3,
    )
    job.train(config)
    return config


def _script(module, args, environ):
    return subprocess.run(
        [sys.executable, "-m", module] + args,
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _environ_without_log_level():
    return {k: v for k, v in os.environ.items() if k != quiet_tensorflow.LEVEL_VARIABLE}


# --- fast: the checks, before any graph is built ---------------------------------------------


@pytest.mark.parametrize(
    "total, batch, towers, fix",
    [
        (20, 9, 3, "--eval_batch_size=10"),  # 9 + 9 + 2: the last batch is short of 3
        (20, 2, 3, "--eval_batch_size=4"),  # every batch is short
        (1000, 499, 4, "--eval_batch_size=500"),  # 499 + 499 + 2
    ],
)
def test_a_batch_short_of_the_towers_is_refused_with_a_batch_size_that_works(
    total, batch, towers, fix
):
    with pytest.raises(options.FlagError) as error:
        eval_lib.check_batches_fill_the_towers(total, batch, towers)
    message = str(error.value)
    assert message.startswith("--eval_batch_size=%d over %d towers" % (batch, towers))
    assert "Fix: %s, or fewer --num_towers." % fix in message


@pytest.mark.parametrize("total, batch, towers", [(20, 8, 3), (20, 20, 3), (1000, 500, 8)])
def test_batches_that_fill_every_tower_pass(total, batch, towers):
    eval_lib.check_batches_fill_the_towers(total, batch, towers)


def test_the_default_tower_count_is_the_runs(tmp_path):
    run = types.SimpleNamespace(num_towers=3, device_type="cpu")  # a run's record
    assert len(eval_lib.eval_devices(run)) == 3
    assert len(eval_lib.eval_devices(run, 1)) == 1
    with pytest.raises(options.FlagError, match="--num_towers=0: evaluate on at least"):
        eval_lib.eval_devices(run, 0)


def test_a_level_the_user_set_is_kept():
    assert quiet_tensorflow.keep_tensorflow_quiet({"TF_CPP_MIN_LOG_LEVEL": "0"}) == "0"
    environ = {}
    assert quiet_tensorflow.keep_tensorflow_quiet(environ) == quiet_tensorflow.quiet_level()
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": quiet_tensorflow.quiet_level()}
    assert quiet_tensorflow.quiet_level("/no/such/driver") == "3"


# --- a trained checkpoint, evaluated on 1 and 3 towers (slow) --------------------------------


@pytest.mark.slow  # trains a few steps
def test_three_towers_count_the_correct_predictions_of_one(trained_run):
    results = {
        towers: eval_lib.evaluate_latest(
            trained_run["train_dir"], batch_size=EVAL_BATCH, num_towers=towers
        )
        for towers in (1, 3)
    }
    one, three = results[1], results[3]
    assert one.num_towers == 1 and three.num_towers == 3
    assert one.examples == three.examples == TEST_EXAMPLES
    assert one.correct == three.correct
    assert one.precision_at_1 == three.precision_at_1 == one.correct / TEST_EXAMPLES
    assert one.ema and three.ema
    # Unset, the run's own tower count.
    default = eval_lib.evaluate_latest(trained_run["train_dir"], batch_size=EVAL_BATCH)
    assert default.num_towers == TRAINED_TOWERS and default.correct == one.correct


@pytest.mark.slow  # the eval script in a fresh process
def test_eval_script_on_three_towers_starts_quietly(trained_run):
    one = eval_lib.evaluate_latest(trained_run["train_dir"], batch_size=EVAL_BATCH, num_towers=1)
    completed = _script(
        "examples.cifar10.eval",
        [
            "--train_dir=%s" % trained_run["train_dir"],
            "--num_towers=3",
            "--eval_batch_size=%d" % EVAL_BATCH,
        ],
        _environ_without_log_level(),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "cuInit" not in completed.stderr, completed.stderr[-3000:]
    match = re.search(r"precision@1 = [0-9.]+ \((\d+)/(\d+)\).*, 3 tower\(s\)", completed.stderr)
    assert match, completed.stderr[-3000:]
    assert (int(match.group(1)), int(match.group(2))) == (one.correct, TEST_EXAMPLES)


@pytest.mark.slow  # a fresh process
def test_a_log_level_the_user_set_reaches_tensorflow():
    probe = ["-c", "import examples.cifar10, os; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"]
    environ = _environ_without_log_level()
    for user_level, seen in (("1", "1"), (None, quiet_tensorflow.quiet_level())):
        if user_level is not None:
            environ[quiet_tensorflow.LEVEL_VARIABLE] = user_level
        completed = subprocess.run(
            [sys.executable] + probe, cwd=REPO_ROOT, env=environ, capture_output=True,
            text=True, timeout=120,
        )
        assert completed.stdout.strip() == seen, completed.stderr[-2000:]
        environ.pop(quiet_tensorflow.LEVEL_VARIABLE, None)


@pytest.mark.slow  # the eval script in a fresh process, with the user's own level
@pytest.mark.skipif(
    os.path.exists(quiet_tensorflow.NVIDIA_DRIVER_FILE),
    reason="cuInit only fails (and says so) on a machine without an NVIDIA driver",
)
def test_the_users_level_zero_shows_the_cuinit_line_again(trained_run):
    environ = dict(_environ_without_log_level(), TF_CPP_MIN_LOG_LEVEL="0")
    completed = _script(
        "examples.cifar10.eval",
        ["--train_dir=%s" % trained_run["train_dir"], "--eval_batch_size=%d" % EVAL_BATCH],
        environ,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "cuInit" in completed.stderr


@pytest.mark.slow  # the eval script in a fresh process, once per case
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--num_towers=0"], "error: --num_towers=0: evaluate on at least one tower"),
        (
            ["--num_towers=3", "--eval_batch_size=9"],
            "error: --eval_batch_size=9 over 3 towers",
        ),
    ],
)
def test_eval_script_refuses_in_one_line(trained_run, args, expected):
    completed = _script(
        "examples.cifar10.eval",
        ["--train_dir=%s" % trained_run["train_dir"]] + args,
        dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(expected), completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr
