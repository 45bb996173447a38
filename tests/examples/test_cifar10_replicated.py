"""The CIFAR-10 example with --variable_update=replicated: its flags, their errors, and a
short 2-tower run whose checkpoint the evaluation and the export restore.

A replicated checkpoint must be an ordinary one: tower 0's copies under the plain names,
none of the other towers' 'replicated/tower_<i>/' copies, so that eval.py and export.py,
which build one inference tower, restore it as they restore a parameter-server run.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from examples.cifar10 import data_source, job, main, options, planning, run_folder
from examples.cifar10 import eval as eval_lib
from examples.cifar10 import export as export_lib
from tests.examples.test_cifar10_config import check
from tests.examples.test_cifar10_train import short_run_config
from towerlib import cluster as cluster_lib
from towerlib.update import copies as variable_copies
from towerlib.update.replicated import DEFAULT_PACK_BYTES as DEFAULT_GRADIENT_PACK_BYTES

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLICATED_STEPS = 20


def _config(tmp_path, **overrides):
    values = dict(train_dir=str(tmp_path / "run"), num_towers=2, device_type="cpu")
    values.update(overrides)
    return values  # the train flags given


def _script(module, args, timeout=300):
    """Runs `python -m module args` from the repository root."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, "-m", module] + args,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _flags_of(config):
    """The train script's command line that gives `config`, {flag: value}."""
    return ["--%s=%s" % (name, options.shown(value)) for name, value in config.items()]


# --- the settings, checked before anything is built (fast) ----------------------------------


def test_replicated_without_param_device_is_accepted(tmp_path):
    devices = check(_config(tmp_path, variable_update="replicated"))
    assert devices == ["/device:CPU:0", "/device:CPU:1"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(variable_update="mirrored"),
            "--variable_update=mirrored: update='mirrored' is not a variable update.",
        ),
        (
            dict(variable_update="replicated", gradient_pack_bytes=-1),
            "--gradient_pack_bytes=-1: Replicated(pack_bytes=-1) is not a size. Fix: a size "
            "in bytes >= 0",
        ),
        (
            dict(gradient_pack_bytes=1024),
            "--gradient_pack_bytes=1024: it is an argument of towerlib.Replicated, which "
            "--variable_update=parameter_server does not choose.",
        ),
        (
            dict(variable_update="replicated", param_device="cpu"),
            "--param_device=cpu: it is an argument of towerlib.ParameterServer, which "
            "--variable_update=replicated does not choose.",
        ),
        (
            dict(variable_update="replicated", param_device="gpu"),
            "Fix: drop --param_device, or use --variable_update=parameter_server.",
        ),
    ],
)
def test_bad_variable_update_settings_name_their_flag_and_fix(tmp_path, overrides, message):
    with pytest.raises(options.FlagError) as error:
        check(_config(tmp_path, **overrides))
    assert message in str(error.value)


def test_parameter_server_still_takes_an_explicit_param_device(tmp_path):
    check(_config(tmp_path, param_device="cpu"))
    check(_config(tmp_path, variable_update="replicated", gradient_pack_bytes=0))


def test_replicated_is_refused_on_a_cluster_with_ps_tasks(tmp_path):
    """Replicated all-reduces across the workers: ps tasks would wait for nothing."""
    cluster = cluster_lib.cluster_from_flags(
        "127.0.0.1:2222", "127.0.0.1:2223,127.0.0.1:2224", "worker", 0
    )  # described, never opened
    flags = run_folder.resolve_flags(_config(tmp_path, variable_update="replicated"))
    with pytest.raises(options.FlagError) as error:
        planning.check_cluster_flags(flags, cluster)
    assert str(error.value).startswith(
        "--variable_update=replicated all-reduces across the workers, and the cluster "
        "has 1 ps task(s). Fix: drop --ps_hosts"
    )


def test_a_run_saved_before_the_flags_existed_loads_as_parameter_server(tmp_path):
    config = run_folder.resolve_flags(
        _config(tmp_path, variable_update="replicated", gradient_pack_bytes=1024))
    run_folder.record(config, config.data_dir, config.max_steps)
    assert run_folder.load(config.train_dir) == config
    path = os.path.join(config.train_dir, run_folder.CONFIG_FILE)
    with open(path) as f:
        values = json.load(f)
    for name in ("variable_update", "gradient_pack_bytes"):
        del values[name]
    with open(path, "w") as f:
        json.dump(values, f)
    loaded = run_folder.load(config.train_dir)
    assert loaded.variable_update == "parameter_server"
    assert loaded.gradient_pack_bytes == DEFAULT_GRADIENT_PACK_BYTES


# --- a short replicated run of the train script, evaluated and exported (slow) -------------


@pytest.fixture(scope="module", params=["resnet8", "keras_resnet8"])
def replicated_run(tmp_path_factory, request):
    """The train script with --variable_update=replicated: resnet8 (towerlib layers, or the
    same ResNet as a tf_keras model) on 2 CPU towers for REPLICATED_STEPS steps with a
    weight EMA, on the generated data."""
    config = short_run_config(
        str(tmp_path_factory.mktemp("replicated")),
        model=request.param,
        variable_update="replicated",
        max_steps=REPLICATED_STEPS,
        ema_decay=0.9,
        log_every_n_steps=10,
    )
    completed = _script("examples.cifar10.train", _flags_of(config), timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return config, completed.stderr


@pytest.mark.slow  # reads the replicated run of the train script
def test_the_flags_are_recorded_in_train_config(replicated_run):
    config, log = replicated_run
    saved = run_folder.load(config["train_dir"])
    assert saved.variable_update == "replicated"
    assert saved.gradient_pack_bytes == DEFAULT_GRADIENT_PACK_BYTES
    assert saved.param_device == ""
    assert (
        "variables on every tower (replicated, gradients all-reduced, packed into "
        "buffers of %d bytes)" % DEFAULT_GRADIENT_PACK_BYTES in log
    )


@pytest.mark.slow  # reads the replicated run of the train script
def test_checkpoint_holds_the_parameter_server_names_and_no_copies(replicated_run):
    config, _ = replicated_run
    checkpoint = tf.train.latest_checkpoint(config["train_dir"])
    names = {name for name, _ in tf.train.list_variables(checkpoint)}
    assert not [n for n in names if n.startswith(variable_copies.COPY_PREFIX + "/")]
    # Exactly what the same run saves with parameter_server: its variables and
    # its other saveable state (the input pipeline's position).
    as_parameter_server = dict(config, variable_update="parameter_server")
    with tf.Graph().as_default():
        job.build_step(job.plan_run(as_parameter_server))
        expected = {v.op.name for v in tf.compat.v1.global_variables()}
        expected |= {spec.name for saveable in tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS) for spec in saveable.specs}
    assert names == expected


@pytest.mark.slow  # reads the replicated run of the train script
def test_eval_and_export_restore_the_replicated_checkpoint(replicated_run):
    config, _ = replicated_run
    evaluation = eval_lib.evaluate_latest(config["train_dir"])
    assert evaluation.global_step == REPLICATED_STEPS and evaluation.ema
    assert evaluation.examples == 1000
    assert math.isfinite(evaluation.precision_at_1) and 0 <= evaluation.precision_at_1 <= 1
    saved_model_dir = export_lib.export(config["train_dir"])
    saved = run_folder.load(config["train_dir"])
    _, _, test_files = data_source.prepare(
        saved.data_dir or None, config["train_dir"], need_train=False)
    exported_precision = main.check_saved_model(saved_model_dir, test_files)
    assert abs(exported_precision - evaluation.precision_at_1) <= 0.002


# --- the scripts' one-line errors (slow: a fresh process each) -----------------------------

_CLUSTER = ["--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223,127.0.0.1:2224"]
_NO_PS = "all-reduces across the workers"


@pytest.mark.slow  # the train script in a fresh process, once per case
@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--variable_update=replicated", "--param_device=cpu"],
            "error: --param_device=cpu: it is an argument of towerlib.ParameterServer",
        ),
        (
            ["--variable_update=allreduce"],
            "error: --variable_update=allreduce: update='allreduce' is not a variable update",
        ),
        (["--variable_update=replicated", "--job_name=ps"] + _CLUSTER, _NO_PS),
    ],
)
def test_train_script_refuses_in_one_line(tmp_path, args, expected):
    completed = _script(
        "examples.cifar10.train",
        ["--train_dir=%s" % tmp_path, "--startup_timeout_secs=5", "--ps_timeout_secs=5"]
        + args,
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr


@pytest.mark.slow  # examples/distributed/train.py in a fresh process, once per task
@pytest.mark.parametrize("job_name", ["ps", "worker"])
def test_distributed_example_refuses_replicated_in_one_line(tmp_path, job_name):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    completed = subprocess.run(
        [sys.executable, "examples/distributed/train.py", "--variable_update=replicated",
         "--job_name=%s" % job_name, "--train_dir=%s" % tmp_path] + _CLUSTER,
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and _NO_PS in errors[0], completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr
