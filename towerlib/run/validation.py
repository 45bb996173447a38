"""Checking a training configuration in one pass, before anything is built.

A bad option found after the graph is built (or hours into training, at the
first checkpoint) costs a restart per mistake. `validate_config` checks every
option it is given, gathers every problem, and raises one `ConfigError`
listing them all, each with the fix. `run_training` calls it with its own
options; a training script calls it first with everything it knows (tower
count, batch sizes, devices, modes, paths), before building the graph.
"""

import difflib

import tensorflow as tf

from towerlib.checks import loop_options
from towerlib.checks.problems import ConfigError, ConfigProblem, Problems
from towerlib.run import warm_start
from towerlib.step import devices as devices_lib
from towerlib.step import options as step_options

__all__ = ["ConfigError", "ConfigProblem", "validate_config"]


def _check_batch(check, towers, global_batch_size, per_tower_batch_size,
                 examples_per_step):
    global_ok = check.positive_int(
        "global_batch_size", global_batch_size,
        "give the number of examples in one optimizer step (all towers together).")
    tower_ok = check.positive_int(
        "per_tower_batch_size", per_tower_batch_size,
        "give the number of examples each tower gets per step.")
    if global_ok and towers is not None and global_batch_size < towers:
        check.add("global_batch_size",
                  f"is {global_batch_size}, fewer than the {towers} towers, so some "
                  "tower would get no examples.",
                  f"use a global batch of at least {towers} or fewer towers.")
    if global_ok and tower_ok and towers is not None \
            and per_tower_batch_size * towers != global_batch_size:
        check.add("per_tower_batch_size",
                  f"{per_tower_batch_size} x {towers} towers = "
                  f"{per_tower_batch_size * towers}, but global_batch_size is "
                  f"{global_batch_size}.",
                  "give only one of them (towerlib splits the global batch), or make "
                  "global_batch_size = per_tower_batch_size x num_towers.")
    if check.positive_int("examples_per_step", examples_per_step,
                          "give the global batch size (it only scales examples/sec)."):
        if global_ok and examples_per_step != global_batch_size:
            check.add("examples_per_step",
                      f"is {examples_per_step} but global_batch_size is "
                      f"{global_batch_size}.",
                      "pass the global batch size as examples_per_step.")


_REQUIRED_FIXES = {
    "train_dir": "give a directory for checkpoints and summaries.",
    "max_steps": "give the global step to stop at.",
    "num_towers": "give the number of towers.",
    "global_batch_size": "give the number of examples per optimizer step.",
}


# validate_config's own arguments, next to the build's and the loop's options.
_OWN = ("tower_fn", "inputs", "optimizer", "global_batch_size", "per_tower_batch_size",
        "probe_writes", "required")


def validate_config(*, tower_fn=None, inputs=None, optimizer=None, global_batch_size=None,
                    per_tower_batch_size=None, probe_writes=True, required=(), **options):
    """Checks every given option and raises one ConfigError listing all problems.

    `options` are build_train_graph's (towerlib.step.options.STEP_OPTIONS) and
    run_training's (towerlib.checks.loop_options.LOOP_OPTIONS) by the same
    names, so that a script checks all its flags at once, before building
    anything; an unknown name is a problem too, naming the closest option.

    Options left as None are not checked. The options of build_train_graph
    go through the same checks it runs itself (towerlib.step.options; the
    towers' through towerlib.step.devices.tower_problems), so a
    script can check a whole configuration first and get every problem at
    once. Nothing is built or left behind: `train_dir` (or, when it does not
    exist yet, its nearest existing parent) is probed by creating and
    deleting a temporary file (directory), since permission bits do not
    tell, e.g. for root or on a read-only or full file system.

    Args:
      tower_fn, inputs, optimizer: as for build_train_graph.
      global_batch_size: examples per optimizer step, all towers together.
      per_tower_batch_size: examples per tower, when the script has that
        option too (it must agree with the global batch).
      probe_writes: probe train_dir's writability (only the chief writes).
      required: names of options that must be given (not None), e.g.
        ('train_dir', 'max_steps') for run_training.
      **options: build_train_graph's and run_training's options; session_config
        (the ConfigProto the session will use) is checked for '/device:CPU:i'
        towers existing in it.

    Raises:
      ConfigError: with one ConfigProblem per problem.
    """
    check = Problems()
    _check_names(check, options)
    step = {name: options.get(name) for name in step_options.STEP_OPTIONS.names}
    loop = loop_options.LOOP_OPTIONS.with_defaults(
        {name: value for name, value in options.items() if name in loop_options.LOOP_OPTIONS},
        required=False)
    given = dict(step, global_batch_size=global_batch_size, **loop)
    for option in required:
        if given.get(option, None) is None:
            check.add(option, "is required.", _REQUIRED_FIXES.get(option, "give it."))
    session_config = _session_config(check, loop["session_config"])
    cpu_devices = None if session_config is None else session_config.device_count.get("CPU", 1)
    problems, towers = devices_lib.tower_problems(
        step["num_towers"], step["devices"], step["device_type"],
        gpus=devices_lib.local_gpu_count(), cpu_devices=cpu_devices, judge_devices=True)
    for problem in problems:
        check.add(problem.option, problem.what, problem.fix)
    _check_batch(check, towers, global_batch_size, per_tower_batch_size,
                 loop["examples_per_step"])
    step_options.check_step_options(
        check, {name: value for name, value in step.items() if value is not None},
        optimizer=optimizer, tower_fn=tower_fn, inputs=inputs,
        global_batch_size=global_batch_size, towers=towers)
    _check_loop(check, loop, probe_writes)
    _check_loop_arguments(check, options, loop)
    if check:
        raise ConfigError(check.problems)


def _check_names(check, options):
    known = step_options.STEP_OPTIONS.names + loop_options.LOOP_OPTIONS.names + _OWN
    for name in options:
        if name not in known:
            closest = difflib.get_close_matches(name, known, n=1)
            check.add(name, "is not an option of build_train_graph or run_training.",
                      f"{closest[0]}" if closest else "drop it.")


def _session_config(check, session_config):
    if session_config is not None and not isinstance(session_config,
                                                     tf.compat.v1.ConfigProto):
        check.add("session_config", f"is a {type(session_config).__name__}.",
                  "pass towerlib.session_config(num_towers) or a tf.compat.v1.ConfigProto.")
        return None
    return session_config


def _check_loop_arguments(check, options, loop):
    """hooks, stop_on_signals and collective_timeout_secs when given: run_training's own
    pre-check (their types), so both say the same; warm_start_from's source too."""
    for option, problem, fix in warm_start.warm_start_problems(loop["warm_start_from"]):
        check.add(option, problem, fix)
    if not {"hooks", "stop_on_signals", "collective_timeout_secs"} & set(options):
        return
    for option, problem, fix in loop_options.loop_argument_problems(
            loop["hooks"], loop["stop_on_signals"], loop["collective_timeout_secs"]):
        check.add(option, problem, fix)


def _check_loop(check, loop, probe_writes):
    loop_options.check_train_dir(check, loop["train_dir"], probe_writes and loop["is_chief"])
    loop_options.check_training_loop(
        check, loop["max_steps"], loop["save_checkpoint_steps"],
        loop["save_checkpoint_secs"], loop["save_summaries_steps"],
        loop["log_every_n_steps"], loop["max_checkpoints_to_keep"], loop["master"],
        loop["is_chief"])
    if loop["trace_steps"] is not None:
        loop_options.check_trace_steps(check, loop["trace_steps"], loop["max_steps"])
    loop_options.check_restore_from(check, loop["restore_from"])
    loop_options.check_session_parts(check, loop["scaffold"], loop["session_creator_wrapper"])
