"""Each option is declared once (name, default, check, doc): the public signatures, the
refusals, validate_config and docs/api.md's table follow the declaration."""

import ast
import inspect
import pathlib
import re

import pytest
import tensorflow as tf

import towerlib
from towerlib.checks.declared_options import REQUIRED
from towerlib.checks.loop_options import LOOP_OPTIONS
from towerlib.cluster.ps_step import SYNC_STEP_OPTIONS
from towerlib.step.options import STEP_OPTIONS

ROOT = pathlib.Path(__file__).resolve().parents[2]


def keyword_parameters(function, skip):
    return [(name, p.default) for name, p in inspect.signature(function).parameters.items()
            if name not in skip]


def test_build_train_graph_takes_the_declared_options_in_order_with_their_defaults():
    got = keyword_parameters(towerlib.build_train_graph, ("tower_fn", "inputs", "optimizer"))
    assert got == [(o.name, o.default) for o in STEP_OPTIONS.options]
    doc = towerlib.build_train_graph.__doc__
    assert [o.name for o in STEP_OPTIONS.options if o.name not in doc] == []


def test_run_training_takes_the_declared_loop_options_in_order_with_their_defaults():
    got = keyword_parameters(towerlib.run_training, ("train_graph",))
    want = [(o.name, inspect.Parameter.empty if o.default is REQUIRED else o.default)
            for o in LOOP_OPTIONS.options]
    assert got == want
    doc = towerlib.run_training.__doc__
    assert [o.name for o in LOOP_OPTIONS.options if o.name not in doc] == []


def test_an_unknown_option_of_the_ps_path_build_is_named_with_the_closest():
    assert set(SYNC_STEP_OPTIONS.names) == set(STEP_OPTIONS.names) - {"devices", "workers"}
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bn_mod'\. Fix: bn_mode"):
        SYNC_STEP_OPTIONS.with_defaults({"bn_mod": "sync"})


def test_validate_config_names_an_unknown_option_and_the_closest():
    with pytest.raises(towerlib.ConfigError) as raised:
        towerlib.validate_config(accumulation_step=2, bn_mode="sync")
    (problem,) = raised.value.problems
    assert problem.option == "accumulation_step" and "accumulation_steps" in str(problem)


def test_the_api_page_has_a_row_for_every_declared_option_and_no_other():
    page = (ROOT / "docs" / "api.md").read_text()
    section = page.split("## `towerlib.build_train_graph", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert named == set(STEP_OPTIONS.names) | {"tower_fn", "inputs", "optimizer"}


def functions_spelling_build_options(minimum=6):
    """Functions in towerlib/ whose signature names `minimum` or more of the build's options."""
    names = set(STEP_OPTIONS.names)
    found = []
    for path in (ROOT / "towerlib").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.args + node.args.kwonlyargs
                if len({a.arg for a in arguments} & names) >= minimum:
                    found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_at_most_the_public_build_spells_the_options_out():
    assert functions_spelling_build_options() == ["towerlib/step/build.py:build_train_graph"]


MODE_COMPARISON = re.compile(
    r"""(bn_mode\s*(==|!=|\bin\b|\bnot in\b))|((==|!=)\s*["'](first_tower|all_towers|sync)["'])"""
    r"""|(["'](first_tower|all_towers|sync)["']\s*(==|!=))|(\[bn_mode\])""")


def test_no_module_compares_a_batch_norm_mode_with_a_string():
    """Modes are objects (towerlib.batchnorm.modes): the strings are read in one place."""
    found = []
    for path in (ROOT / "towerlib").rglob("*.py"):
        if path.name == "modes.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if MODE_COMPARISON.search(code) and not code.strip().startswith(("f\"", "\"")):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_a_mode_object_says_what_it_needs():
    modes = {str(m): towerlib.batchnorm.modes.resolve_bn_mode(m) for m in towerlib.BN_MODES}
    assert [name for name, m in modes.items() if m.normalizes_globally] == ["sync"]
    assert [name for name, m in modes.items() if m.pools_every_tower] == ["all_towers"]
    assert modes["sync"].exchanges(num_towers=1, peers=2)  # a worker's peers count
    assert not modes["sync"].exchanges(num_towers=1)
    with pytest.raises(ValueError, match="cannot span the 2 workers"):
        modes["sync"].check_replicas(2)
    with tf.Graph().as_default():
        first = towerlib.TowerContext(index=0, num_towers=2)
        second = towerlib.TowerContext(index=1, num_towers=2)
    assert [modes["first_tower"].runs_update_ops_of(c) for c in (first, second)] == [True,
                                                                                    False]


def test_validate_config_takes_every_run_training_option():
    towerlib.validate_config(restore_from=None, hooks=(), evaluation=None, scaffold=None,
                             session_creator_wrapper=None, stop_on_signals=(2, 15),
                             collective_timeout_secs=60.0)
    with pytest.raises(towerlib.ConfigError, match="stop_on_signals"):
        towerlib.validate_config(stop_on_signals=(9,))


def test_the_build_lists_every_bad_option_at_once_as_validate_config_does():
    with tf.Graph().as_default(), pytest.raises(towerlib.ConfigError) as built:
        towerlib.build_train_graph(
            lambda inputs, ctx: tf.reduce_mean(inputs), tf.zeros([4, 2]),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), bn_mode="snyc",
            accumulation_steps=0, num_towers=1)
    with pytest.raises(towerlib.ConfigError) as validated:
        towerlib.validate_config(bn_mode="snyc", accumulation_steps=0)
    assert [p.option for p in built.value.problems] == ["bn_mode", "accumulation_steps"]
    assert built.value.problems == validated.value.problems


def test_one_bad_option_is_raised_as_its_own_check_raised_it():
    with tf.Graph().as_default(), pytest.raises(TypeError, match="summaries must be True"):
        towerlib.build_train_graph(
            lambda inputs, ctx: tf.reduce_mean(inputs), tf.zeros([4, 2]),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), summaries="yes", num_towers=1)
