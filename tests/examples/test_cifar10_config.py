"""Fast tests of the CIFAR-10 example's settings: flag errors, schedule, models."""

import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from examples.cifar10 import data, generate, job, models, options, run_folder, schedule


@pytest.fixture(scope="module")
def generated_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("data"))
    generate.generate(folder, train_per_file=20, test_examples=20)
    return folder


def _config(tmp_path, **overrides):
    """The train flags given (the others: the train script's defaults)."""
    values = dict(train_dir=str(tmp_path / "run"), num_towers=2, device_type="cpu")
    values.update(overrides)
    return values


def check(args):
    """The train script's checks of its flags, before any data is touched; the devices."""
    flags = run_folder.resolve_flags(args)
    job.check_flags(flags, *job.strategies(flags))
    return towerlib.tower_devices(flags.num_towers or None, flags.device_type or None)


# --- clear errors, before any graph is built -----------------------------------------------


def test_global_batch_smaller_than_tower_count_is_refused(tmp_path):
    with pytest.raises(options.FlagError) as e:
        check(_config(tmp_path, num_towers=4, global_batch_size=3))
    message = str(e.value)
    assert "--global_batch_size=3" in message and "4 towers" in message
    assert "at least 4" in message


def test_uneven_global_batch_is_accepted(tmp_path):
    devices = check(_config(tmp_path, num_towers=3, global_batch_size=128))
    assert devices == ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]


def test_unknown_model_name_lists_the_known_ones(tmp_path):
    with pytest.raises(options.FlagError) as e:
        check(_config(tmp_path, model="vgg16"))
    assert "Unknown model 'vgg16'" in str(e.value)
    assert "convnet" in str(e.value) and "resnet20" in str(e.value)


def test_resnet_depth_must_be_6n_plus_2(tmp_path):
    with pytest.raises(options.FlagError, match=r"6n \+ 2.*got 21"):
        check(_config(tmp_path, model="resnet21"))


@pytest.mark.parametrize(
    "overrides, flag",
    [
        (dict(bn_mode="every_tower"), "--bn_mode"),
        (dict(sync_transport="nccl"), "--sync_transport=nccl: exchange='nccl' is not an"),
        (dict(optimizer="adam"), "--optimizer"),
        (dict(param_device="tpu"), "--param_device"),
        (dict(ema_decay=1.5), "--ema_decay"),
        (dict(augmentation="mixup"), "--augmentation"),
        (dict(num_towers=-1), "--num_towers"),
        (dict(download=True), "--download=True: it needs --data_dir"),
    ],
)
def test_bad_settings_name_their_flag(tmp_path, overrides, flag):
    with pytest.raises(options.FlagError, match=flag):
        check(_config(tmp_path, **overrides))


@pytest.mark.parametrize("overrides, flag", [
    (dict(momentum=5.0), "--momentum=5:"),
    (dict(momentum=1.0), "--momentum=1:"),
    (dict(momentum=-0.5), "--momentum=-0.5"),
    (dict(momentum=float("nan")), "--momentum=nan"),
    (dict(weight_decay=-1e-4), "--weight_decay=-0.0001"),
    (dict(weight_decay=float("inf")), "--weight_decay=inf"),
])
def test_hyperparameters_that_cannot_be_right_are_refused_in_one_line(
        tmp_path, overrides, flag):
    # --momentum=5 and --weight_decay=inf trained to non-finite weights.
    with pytest.raises(options.FlagError) as raised:
        check(_config(tmp_path, **overrides))
    assert str(raised.value).startswith(flag) and "\n" not in str(raised.value)
    assert "use a value in [0, 1)" in str(raised.value) or "finite" in str(raised.value)


def test_momentum_zero_and_no_weight_decay_are_accepted(tmp_path):
    check(_config(tmp_path, momentum=0.0, weight_decay=0.0))


def test_missing_data_dir_is_reported_before_building(tmp_path):
    missing = str(tmp_path / "no_such_dir")
    with pytest.raises(data.DataError, match="does not exist.*--download"):
        job.plan_run(_config(tmp_path, data_dir=missing))


def test_truncated_data_file_is_reported_before_building(tmp_path):
    folder = tmp_path / "data"
    generate.generate(str(folder), train_per_file=4, test_examples=4)
    path = folder / data.BATCHES_DIR / "data_batch_5.bin"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(data.DataError, match=r"data_batch_5\.bin.*5000 bytes.*truncated"):
        job.plan_run(_config(tmp_path, data_dir=str(folder)))


def test_bad_learning_rate_settings_are_refused_before_the_data_is_touched(tmp_path):
    # The data folder does not exist: the flag error must come first.
    missing = str(tmp_path / "no_data")
    with pytest.raises(options.FlagError, match="--lr_decay_epochs.*ascending"):
        job.plan_run(_config(tmp_path, data_dir=missing, lr_decay_epochs=[5, 2]))
    with pytest.raises(options.FlagError, match="learning_rate must be a positive"):
        job.plan_run(_config(tmp_path, data_dir=missing, learning_rate=0.0))
    with pytest.raises(options.FlagError, match=r"--lr_decay_epochs.*the first decay "
                       r"\(epoch 2\) comes before the warm-up ends \(epoch 3\)"):
        job.plan_run(_config(tmp_path, data_dir=missing, lr_decay_epochs=[2, 5],
                             warmup_epochs=3))


def test_restart_with_another_model_is_refused(tmp_path, generated_dir):
    first = run_folder.resolve_flags(_config(tmp_path, data_dir=generated_dir))
    run_folder.record(first, first.data_dir, first.max_steps)
    with pytest.raises(options.FlagError, match="--model=convnet.*--model=resnet20"):
        job.plan_run(_config(tmp_path, data_dir=generated_dir, model="resnet20"))


def test_config_round_trips_through_its_file(tmp_path):
    config = run_folder.resolve_flags(
        _config(tmp_path, model="resnet8", lr_decay_epochs=[3.0, 4.5], ema_decay=0.9))
    run_folder.record(config, "/data/cifar", config.max_steps)
    loaded = run_folder.load(config.train_dir)
    assert vars(loaded) == dict(vars(config), data_dir="/data/cifar")
    assert os.listdir(config.train_dir) == [run_folder.CONFIG_FILE]
    with pytest.raises(options.FlagError, match="No train_config.json"):
        run_folder.load(str(tmp_path))


# --- the learning-rate schedule counts global batches ---------------------------------------


def test_schedule_boundaries_follow_the_global_batch():
    at_128 = schedule.make_schedule(0.1, 128, 50000, decay_epochs=[100, 150])
    at_512 = schedule.make_schedule(0.1, 512, 50000, decay_epochs=[100, 150])
    assert at_128.boundaries == [39062, 58594]  # round(100 * 50000 / 128), ...
    assert at_512.boundaries == [9766, 14648]
    assert at_128.base_rate == at_512.base_rate == 0.1


def test_schedule_does_not_depend_on_the_tower_count(tmp_path, generated_dir):
    plans = [
        job.plan_run(
            _config(
                tmp_path / str(n),
                data_dir=generated_dir,
                num_towers=n,
                global_batch_size=16,
                lr_decay_epochs=[4, 6],
                train_epochs=8,
            )
        )
        for n in (1, 2)
    ]
    assert plans[0].lr_schedule == plans[1].lr_schedule
    assert plans[0].max_steps == plans[1].max_steps == 50  # 8 epochs x 100 / 16
    assert plans[0].lr_schedule.boundaries == [25, 38]


def test_linear_scaling_and_warmup():
    rate = schedule.make_schedule(
        0.1,
        512,
        1024,
        decay_epochs=[4],
        decay_factor=0.5,
        warmup_epochs=1,
        scale_with_batch=True,
    )
    assert rate.base_rate == pytest.approx(0.4)
    assert rate.warmup_steps == 2 and rate.boundaries == [8]
    # As in TensorFlow 1, the boundary's own step (8) still runs at the old rate.
    assert [rate.rate_at(s) for s in (0, 1, 2, 7, 8, 9, 20)] == pytest.approx(
        [0.2, 0.4, 0.4, 0.4, 0.4, 0.2, 0.2]
    )


def test_schedule_tensor_matches_the_python_rule():
    rate = schedule.make_schedule(0.1, 128, 640, decay_epochs=[2, 3], warmup_epochs=1)
    steps = [0, 3, 4, 5, 9, 10, 14, 15, 40]
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        tensor = rate.tensor(step)
        with tf.compat.v1.Session() as session:
            values = [session.run(tensor, {step: s}) for s in steps]
    np.testing.assert_allclose(values, [rate.rate_at(s) for s in steps], rtol=1e-6)
    assert values[0] == pytest.approx(0.02) and values[-1] == pytest.approx(0.001)


# --- the models ------------------------------------------------------------------------------


def _trainable_weights(model, num_towers=1):
    with tf.Graph().as_default():
        images = tf.zeros([4, 32, 32, 3])
        labels = tf.zeros([4], tf.int32)
        train_graph = towerlib.build_train_graph(
            model,
            (images, labels),
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=["/device:CPU:%d" % i for i in range(num_towers)],
        )
        count = sum(v.shape.num_elements() for v in tf.compat.v1.trainable_variables())
        logits = train_graph.tower_outputs[0]["logits"]
        return count, logits.shape.as_list(), len(tf.compat.v1.global_variables())


def test_resnet20_has_the_published_size_and_towers_share_it():
    count, logits_shape, variables_1 = _trainable_weights(models.make_model("resnet20"))
    # He et al. report 0.27M parameters for ResNet-20 (with 1x1 projection shortcuts here).
    assert 260_000 < count < 280_000
    assert logits_shape == [2 * 2, 10]
    _, logits_shape, variables_2 = _trainable_weights(models.make_model("resnet20"), 2)
    assert logits_shape == [2, 10] and variables_1 == variables_2


def test_convnet_is_the_tutorial_network():
    count, logits_shape, _ = _trainable_weights(models.make_model("convnet"))
    # conv 5x5x3x64 + 5x5x64x64, fc 4096x384 + 384x192 + 192x10 (+ biases, batch norm).
    expected = (
        5 * 5 * 3 * 64
        + 5 * 5 * 64 * 64
        + 4096 * 384
        + 384
        + 384 * 192
        + 192
        + 192 * 10
        + 10
        + 2 * (64 + 64)
    )
    assert count == expected
    assert logits_shape == [4, 10]


def test_weight_decay_is_registered_once_per_weight():
    with tf.Graph().as_default():
        images = tf.zeros([4, 32, 32, 3])
        labels = tf.zeros([4], tf.int32)
        towerlib.build_train_graph(
            models.make_model("resnet8", weight_decay=1e-3),
            (images, labels),
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=["/device:CPU:0", "/device:CPU:1"],
        )
        regularized = tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES
        )
        kernels = [v for v in tf.compat.v1.trainable_variables() if "weights" in v.name]
        assert len(regularized) == len(kernels) > 0
