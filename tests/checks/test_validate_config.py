"""validate_config checks every option of build_train_graph, with the build's own checks."""

import inspect

import pytest
import tensorflow as tf

import towerlib

# One wrong value per build_train_graph option, and a word its problem must contain.
WRONG = {
    "tower_fn": ("not a function", "tower_fn"),
    "inputs": ([1, 2, 3], "tf.Tensor"),
    "optimizer": ("adam", "tf.compat.v1.train.Optimizer"),
    "num_towers": (0, "at least 1"),
    "devices": ("/gpu:0", "list of device strings"),
    "device_type": ("tpu", "'gpu', 'cpu'"),
    "bn_mode": ("sync_all", "first_tower, all_towers, sync"),
    "update": ("mirrored", "towerlib.Replicated"),
    "precision": ("half", "compute_dtype must be one of"),
    "exchange": ("nccl", "towerlib.GraphExchange"),
    "accumulation_steps": (2.5, "int >= 1"),
    "global_step": ("step", "step variable"),
    "ema_decay": (1.5, "(0, 1)"),
    "learning_rate": (-0.1, "positive finite"),
    "var_list": ("conv1/weights", "list of variables"),
    "summaries": ("yes", "True or False"),
    "check_isolation": (1, "True or False"),
    "workers": (2, "WorkerGroup"),
    "clipping": (5.0, "towerlib.ClipByGlobalNorm"),
}


def test_every_build_train_graph_option_is_validated():
    """A new option of build_train_graph fails here until validate_config checks it."""
    build_options = [name for name in inspect.signature(towerlib.build_train_graph).parameters]
    assert set(build_options) == set(WRONG), "give every option a wrong value above"
    for option in build_options:
        value, word = WRONG[option]
        with pytest.raises(towerlib.ConfigError) as raised:
            towerlib.validate_config(**{option: value})
        problems = {p.option: str(p) for p in raised.value.problems}
        assert option in problems, (option, problems)
        assert word in problems[option], (option, problems[option])


def test_build_refuses_what_validate_config_refuses_with_the_same_words():
    """One rule, two callers: the build's error text is the problem validate_config lists."""
    with tf.Graph().as_default():
        images = tf.zeros([4, 2])
        for option in ("update", "precision", "exchange", "accumulation_steps", "bn_mode"):
            value, word = WRONG[option]
            with pytest.raises(ValueError, match=None) as built:
                towerlib.build_train_graph(
                    lambda x, ctx: tf.reduce_mean(x), images,
                    tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=1,
                    **{option: value})
            with pytest.raises(towerlib.ConfigError) as validated:
                towerlib.validate_config(**{option: value})
            (problem,) = validated.value.problems
            assert problem.problem in str(built.value), option
            assert word in str(built.value)


@pytest.mark.parametrize("options", [
    dict(num_towers=0), dict(num_towers=2.0), dict(devices="/gpu:0"), dict(devices=[]),
    dict(devices=["gpu zero"]), dict(devices=["/device:CPU:0", "/cpu:0"]),
    dict(num_towers=3, devices=["/device:CPU:0", "/device:CPU:1"]),
    dict(num_towers=1, device_type="tpu"), dict(tower_fn="not a function"),
    dict(tower_fn=towerlib.TowerModel)])
def test_the_build_raises_the_tower_problem_validate_config_lists(options):
    """The device, tower count and tower function rules have one home each: the build's
    error is validate_config's problem, word for word."""
    with pytest.raises(towerlib.ConfigError) as validated:
        towerlib.validate_config(**options)
    (problem,) = validated.value.problems
    options.setdefault("tower_fn", lambda x, ctx: tf.reduce_mean(x))
    with tf.Graph().as_default():
        with pytest.raises((ValueError, TypeError)) as built:
            towerlib.build_train_graph(
                inputs=tf.zeros([4, 2]),
                optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.1), **options)
    assert str(built.value) == f"{problem.problem} Fix: {problem.fix}"


@pytest.mark.parametrize("bn_mode,update,exchange", [
    ("first_tower", "parameter_server", "graph"),
    ("all_towers", towerlib.ParameterServer(), towerlib.CollectiveExchange()),
])
def test_an_exchange_where_nothing_is_exchanged_is_refused_everywhere(bn_mode, update,
                                                                      exchange):
    """An option without effect is refused, by the build and by
    validate_config alike."""
    with pytest.raises(towerlib.ConfigError, match="has no effect"):
        towerlib.validate_config(bn_mode=bn_mode, update=update, exchange=exchange)
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="has no effect.*Drop exchange"):
            towerlib.build_train_graph(
                lambda x, ctx: tf.reduce_mean(x), tf.zeros([4, 2]),
                tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2,
                device_type="cpu", bn_mode=bn_mode, update=update, exchange=exchange)
    towerlib.validate_config(bn_mode="sync", exchange=exchange)
    towerlib.validate_config(update="replicated", exchange=exchange)


def test_accumulation_needs_an_example_per_tower_and_micro_batch():
    with pytest.raises(towerlib.ConfigError, match="accumulation_steps x towers = 4 x 2"):
        towerlib.validate_config(num_towers=2, global_batch_size=6, accumulation_steps=4)
    towerlib.validate_config(num_towers=2, global_batch_size=8, accumulation_steps=4)


def test_accumulation_without_a_tower_count_needs_an_example_per_micro_batch():
    with pytest.raises(towerlib.ConfigError, match=r"accumulation_steps: The global batch "
                       r"has 3 examples, fewer than accumulation_steps x towers = 4 x 1"):
        towerlib.validate_config(global_batch_size=3, accumulation_steps=4)
    towerlib.validate_config(global_batch_size=4, accumulation_steps=4)


def test_trace_steps_are_global_steps():
    with pytest.raises(towerlib.ConfigError, match="trace_steps"):
        towerlib.validate_config(trace_steps=[0, 2])
    towerlib.validate_config(trace_steps=[1, 20])


def test_float16_with_sync_replicas_is_refused_by_validate_config_too():
    sync = tf.compat.v1.train.SyncReplicasOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), 2)
    with pytest.raises(towerlib.ConfigError, match=r"Float16\(\) with SyncReplicasOptimizer"):
        towerlib.validate_config(optimizer=sync, precision="float16")


def test_workers_need_an_update_that_exchanges_gradients():
    """Across workers a parameter server in one process cannot meet the others' gradients."""
    group = towerlib.exchange.WorkerGroup(num_workers=2, worker_index=0)
    with pytest.raises(towerlib.ConfigError) as raised:
        towerlib.validate_config(workers=group, update="parameter_server")
    (problem,) = raised.value.problems
    assert problem.option == "workers" and "towerlib.Replicated()" in str(problem)
    towerlib.validate_config(workers=group, update=towerlib.Replicated())
