"""Checking a training configuration in one pass, before anything is built.

A bad option found after the graph is built (or hours into training, at the
first checkpoint) costs a restart per mistake. `validate_config` checks every
option it is given, gathers every problem, and raises one `ConfigError`
listing them all, each with the fix. `run_training` calls it with its own
options; a training script calls it first with everything it knows (tower
count, batch sizes, devices, modes, paths), before building the graph.
"""

import dataclasses
import difflib
import numbers

import tensorflow as tf

from towerlib.checks import loop_options
from towerlib.step import accumulation
from towerlib.step import devices as devices_lib
from towerlib.step import options as step_options
from towerlib.update import choice as update_choice


@dataclasses.dataclass(frozen=True)
class ConfigProblem:
    """One bad option: which one, what is wrong, and how to fix it."""

    option: str
    problem: str
    fix: str

    def __str__(self):
        # A problem reported by an option's own check already names the fix.
        return f"{self.option}: {self.problem}" + (f" Fix: {self.fix}" if self.fix else "")


class ConfigError(ValueError):
    """Every problem `validate_config` found, in one error.

    Attributes:
      problems: the ConfigProblems, in the order the options were checked.
    """

    def __init__(self, problems):
        self.problems = list(problems)
        count = len(self.problems)
        if count == 1:  # the first line is the problem itself
            super().__init__(f"{self.problems[0]} (nothing was built or run)")
            return
        options = ", ".join(dict.fromkeys(p.option for p in self.problems))
        lines = [f"{count} problems in the training configuration ({options}; nothing "
                 "was built or run):"]
        lines += [f"  - {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class _Checker:
    """Collects problems; each check method adds zero or more."""

    def __init__(self):
        self.problems = []

    def add(self, option, problem, fix):
        self.problems.append(ConfigProblem(option, problem, fix))

    def positive_int(self, option, value, fix, allow_none=True, minimum=1):
        if value is None:
            if not allow_none:
                self.add(option, "is required.", fix)
            return False
        if not _is_int(value) or value < minimum:
            self.add(option, f"must be an int >= {minimum}, got {value!r}.", fix)
            return False
        return True


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


# validate_config's own options, next to the build's and the loop's.
_OWN = ("tower_fn", "inputs", "optimizer", "global_batch_size", "per_tower_batch_size",
        "probe_writes", "required")
# The loop options judged with each other (hooks, stop_on_signals and the collective
# timeout by run_training's pre-check; scaffold, restore_from, evaluation when running).
_LOOP_CHECKED = ("train_dir", "max_steps", "save_checkpoint_steps", "save_checkpoint_secs",
                 "save_summaries_steps", "log_every_n_steps", "examples_per_step",
                 "max_checkpoints_to_keep", "trace_steps", "master", "is_chief",
                 "session_config")


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
    check = _Checker()
    step = {name: options.get(name) for name in step_options.STEP_OPTIONS.names}
    loop = {name: options.get(name) for name in _LOOP_CHECKED}
    loop["master"] = options.get("master", "")
    loop["is_chief"] = options.get("is_chief", True)
    _check_names(check, options)
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
    arguments = dict(tower_fn=tower_fn, inputs=inputs, optimizer=optimizer)
    resolved = _check_step_options(check, dict(arguments, **{
        name: value for name, value in step.items() if name in step_options.OPTION_CHECKS}))
    _check_step_combinations(check, resolved, towers, global_batch_size, step["bn_mode"],
                             optimizer if "optimizer" in resolved else None)
    _check_loop(check, loop, probe_writes)
    _check_loop_arguments(check, options)
    if check.problems:
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


def _check_loop_arguments(check, options):
    """hooks, stop_on_signals and collective_timeout_secs when given: run_training's own
    pre-check (their types), so both say the same."""
    given = {name: options[name] for name in ("hooks", "stop_on_signals",
                                              "collective_timeout_secs") if name in options}
    if not given:
        return
    defaults = {o.name: o.default for o in loop_options.LOOP_OPTIONS.options}
    arguments = {name: given.get(name, defaults[name]) for name in defaults
                 if name in ("hooks", "stop_on_signals", "collective_timeout_secs")}
    for option, problem, fix in loop_options.loop_argument_problems(**arguments):
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


def _check_step_options(check, options):
    """Each given build option through its own check; {option: resolved value}."""
    resolved = {}
    for option, value in options.items():
        if value is None:
            continue
        try:
            resolved[option] = step_options.OPTION_CHECKS[option](value)
        except (ValueError, TypeError) as error:
            _add_error(check, option, error)
    return resolved


def _add_error(check, option, error):
    """A check's error as a ConfigProblem: its text up to 'Fix: ', and the fix."""
    problem, _, fix = str(error).partition(" Fix: ")
    check.add(option, problem, fix)


def _check_step_combinations(check, resolved, towers, global_batch_size, bn_mode,
                             options_given_optimizer=None):
    """The rules between build options, with the same functions as the build."""
    steps = resolved.get("accumulation_steps")
    if steps and _is_int(global_batch_size) and global_batch_size >= 1:
        try:  # without the tower count, every micro-batch needs one example at least
            accumulation.check_batch_covers_micro_batches(global_batch_size, steps,
                                                          towers or 1)
        except ValueError as error:
            _add_error(check, "accumulation_steps", error)
    if "precision" in resolved and options_given_optimizer is not None:
        try:
            resolved["precision"].check_optimizer(options_given_optimizer)
        except ValueError as error:
            _add_error(check, "precision", error)
    if resolved.get("workers") is not None:
        try:
            step_options.check_workers_apply(
                resolved["workers"],
                resolved.get("update") or update_choice.resolve_update("parameter_server"))
        except ValueError as error:
            _add_error(check, "workers", error)
    if resolved.get("exchange") is not None:
        try:
            step_options.check_exchange_applies(
                resolved["exchange"], bn_mode or "first_tower",
                resolved.get("update") or update_choice.resolve_update("parameter_server"))
        except ValueError as error:
            _add_error(check, "exchange", error)
