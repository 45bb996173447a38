"""The CIFAR-10 example's --compute_dtype, --loss_scale and --accumulation_steps: their
checks, train_config.json, and runs: bfloat16 learns as well as float32 on the same seed,
and two micro-batches per step train, evaluate and export.
"""

import json
import os
import subprocess
import sys

import pytest

import towerlib
from examples.cifar10 import eval as eval_lib
from examples.cifar10 import generate, job, main, options, run_folder
from tests.examples.test_cifar10_config import check
from tests.examples.test_cifar10_train import MODE_RUN_STEPS, short_run_config

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One epoch in bfloat16 of the learning run's recipe ended at 0.854 here; chance is 0.1.
BFLOAT16_EPOCH_BOUND = 0.5


def _config(tmp_path, **overrides):
    values = dict(train_dir=str(tmp_path / "run"), num_towers=2, device_type="cpu")
    values.update(overrides)
    return values  # the train flags given


# --- the settings, checked before anything is built (fast) ----------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        dict(compute_dtype="bfloat16"),
        dict(compute_dtype="float16"),
        dict(compute_dtype="float16", loss_scale="dynamic"),
        dict(compute_dtype="float16", loss_scale="1024"),
        dict(accumulation_steps=4, global_batch_size=8),
    ],
)
def test_good_settings_pass(tmp_path, overrides):
    check(_config(tmp_path, **overrides))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(compute_dtype="float64"),
            "--compute_dtype=float64: compute_dtype must be one of ('float32', 'float16'",
        ),
        (
            dict(compute_dtype="half"),
            "--compute_dtype=half: compute_dtype must be one of ('float32', 'float16'",
        ),
        (
            dict(compute_dtype="bfloat16", loss_scale="dynamic"),
            "--loss_scale=dynamic: it is an argument of towerlib.Float16, which "
            "--compute_dtype=bfloat16 does not choose.",
        ),
        (dict(loss_scale="128"), "--loss_scale=128: it is an argument of towerlib.Float16"),
        (
            dict(compute_dtype="float16", loss_scale="big"),
            "--loss_scale=big: Float16(loss_scale='big'): the loss scale must be 'dynamic'",
        ),
        (
            dict(compute_dtype="float16", loss_scale="-2"),
            "--loss_scale=-2: Float16(loss_scale=-2.0): the loss scale must be 'dynamic'",
        ),
        (
            dict(accumulation_steps=0),
            "--accumulation_steps=0: accumulation_steps must be an int >= 1",
        ),
        (
            dict(accumulation_steps=4, global_batch_size=7),
            "--accumulation_steps=4: The global batch has 7 examples, fewer than "
            "accumulation_steps x towers = 4 x 2 = 8",
        ),
    ],
)
def test_bad_settings_name_their_flag(tmp_path, overrides, message):
    with pytest.raises(options.FlagError) as error:
        check(_config(tmp_path, **overrides))
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_the_loss_scale_reaches_towerlib_as_its_option(tmp_path):
    def precision(**flags):
        _, precision, _ = job.strategies(run_folder.resolve_flags(_config(tmp_path, **flags)))
        return precision

    assert precision() == towerlib.Float32()
    assert precision(compute_dtype="float16") == towerlib.Float16(loss_scale="dynamic")
    assert precision(compute_dtype="float16", loss_scale="dynamic").loss_scale == "dynamic"
    assert precision(compute_dtype="float16", loss_scale="1024").loss_scale == 1024.0


def test_a_run_saved_before_the_flags_existed_loads_with_the_defaults(tmp_path):
    config = run_folder.resolve_flags(
        _config(tmp_path, compute_dtype="float16", loss_scale="512", accumulation_steps=2))
    run_folder.record(config, config.data_dir, config.max_steps)
    assert run_folder.load(config.train_dir) == config
    path = os.path.join(config.train_dir, run_folder.CONFIG_FILE)
    with open(path) as f:
        values = json.load(f)
    for name in ("compute_dtype", "loss_scale", "accumulation_steps"):
        del values[name]
    with open(path, "w") as f:
        json.dump(values, f)
    loaded = run_folder.load(config.train_dir)
    assert (loaded.compute_dtype, loaded.loss_scale, loaded.accumulation_steps) == (
        "float32",
        "",
        1,
    )


@pytest.mark.slow  # the train script in a fresh process, once per case
@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--num_towers=2", "--device_type=cpu", "--global_batch_size=6",
             "--accumulation_steps=4"],
            "error: --accumulation_steps=4: The global batch has 6 examples, fewer than",
        ),
    ],
)
def test_train_script_refuses_in_one_line(tmp_path, args, expected):
    completed = subprocess.run(
        [sys.executable, "-m", "examples.cifar10.train", "--train_dir=%s" % tmp_path] + args,
        cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(expected), completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr


# --- runs on the generated data (slow) ------------------------------------------------------


@pytest.fixture(scope="module")
def generated_data(tmp_path_factory):
    """The built-in generated data set (5000 training, 1000 test examples), written once."""
    folder = str(tmp_path_factory.mktemp("generated"))
    generate.generate(folder)
    return folder


def _learning_run(train_dir, data_dir, compute_dtype):
    """The main job's recipe at a global batch of 64, cut to 4 epochs (decays at 2.5 and
    3.25): near the generated data's ceiling, where one seed's two dtypes can be compared,
    in about 30 s a run on 2 cores.

    Why this and not the main job's batch of 128 for 6 epochs (decays at 4 and 5), which
    the test trained before (0.962 and 0.963, 30,000 examples a run): at batch 64 the
    same learning rate takes twice the steps per epoch and reaches the ceiling on 20,000
    examples (float32 0.976, bfloat16 0.978). Shorter runs are not at the ceiling yet,
    where one seed's two dtypes can differ by chance: 3 epochs gave 0.956 and 0.951 (the
    float32 bound barely held), 4 epochs at batch 128 0.90 and 0.89; and the decays
    matter: at 3 and 3.5, 0.982 and 0.972, on the bound.

    What the comparison still catches: a bfloat16 path that does not learn. With the
    bfloat16 towers' gradients zeroed (the loss cast back to float32 made constant for
    the gradient) this run ends at 0.101, chance, far outside 0.01 of float32; the float32
    run alone must pass 0.95, so both runs must really train. What no comparison at the
    ceiling catches, at this length or the old one: a bfloat16 path that only learns more
    slowly (its loss halved, decays at 3 and 3.5: 0.978).
    """
    return dict(  # the train flags given
        train_dir=train_dir,
        data_dir=data_dir,
        model="convnet",
        num_towers=2,
        device_type="cpu",
        global_batch_size=64,
        learning_rate=0.01,
        train_epochs=4,
        lr_decay_epochs=[2.5, 3.25],
        bn_momentum=0.9,
        ema_decay=0.99,
        compute_dtype=compute_dtype,
        log_every_n_steps=100,
        save_checkpoint_steps=10000,
        seed=1,
    )


def native_bfloat16():
    """Whether this CPU computes bfloat16 in hardware (AVX512_BF16 or AMX). Elsewhere
    TensorFlow emulates it: the learning run's step took 1.87 s in bfloat16 against
    0.23 s in float32 on an AVX2-only EPYC, and its bfloat16 run 21 minutes in the suite."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = set(cpuinfo.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


@pytest.mark.slow  # one epoch in bfloat16: about 2.5 minutes where bfloat16 is emulated
def test_bfloat16_learns_well_above_chance(tmp_path, generated_data):
    """On every CPU: one epoch of the learning run's recipe in bfloat16 (decays out of
    reach) ends far above chance (0.1). A bfloat16 path that does not learn (its towers'
    gradients zeroed) ended the 4-epoch run at 0.101; with no gradient the weights do not
    move, so one epoch stays there too."""
    config = dict(_learning_run(str(tmp_path / "bfloat16"), generated_data, "bfloat16"),
                  train_epochs=1, lr_decay_epochs=[10])
    job.train(config)
    result = eval_lib.evaluate_latest(config["train_dir"])
    print("test precision@1 after one epoch in bfloat16:", result.precision_at_1)
    assert result.examples == 1000 and result.precision_at_1 > BFLOAT16_EPOCH_BOUND


@pytest.mark.slow  # two training runs of about 30 s each on 2 cores with bfloat16 units
@pytest.mark.skipif(not native_bfloat16(), reason=(
    "this CPU emulates bfloat16 (no AVX512_BF16 or AMX): the 4-epoch comparison would "
    "take about 20 minutes; test_bfloat16_learns_well_above_chance runs instead"))
def test_bfloat16_reaches_the_precision_of_float32(tmp_path, generated_data):
    precisions = {}
    for dtype in ("float32", "bfloat16"):
        config = _learning_run(str(tmp_path / dtype), generated_data, dtype)
        job.train(config)
        assert run_folder.load(config["train_dir"]).compute_dtype == dtype
        result = eval_lib.evaluate_latest(config["train_dir"])
        assert result.examples == 1000 and result.ema
        precisions[dtype] = result.precision_at_1
    print("test precision@1:", precisions)
    assert precisions["float32"] > 0.95, precisions
    assert abs(precisions["bfloat16"] - precisions["float32"]) <= 0.01, precisions


@pytest.mark.slow  # a short run of the main job
def test_two_micro_batches_per_step_train_evaluate_and_export(tmp_path, generated_data):
    config = short_run_config(
        str(tmp_path), data_dir=generated_data, accumulation_steps=2,
        max_steps=MODE_RUN_STEPS, log_every_n_steps=60
    )
    figures = main.run(config, options.train_defaults())
    assert run_folder.load(config["train_dir"]).accumulation_steps == 2
    assert figures["global_step"] == MODE_RUN_STEPS  # one step per global batch
    assert figures["examples"] == 1000
    assert figures["precision_at_1"] > 0.5, figures  # chance is 0.1
    assert abs(figures["saved_model_precision_at_1"] - figures["precision_at_1"]) <= 0.002
