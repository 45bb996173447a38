"""The training step's options, each checked by one function, resolved in one place.

`build_train_graph` calls `resolve_step_options` first, so a bad option is
refused (one clear error naming it and the fix) before anything is built.
`towerlib.validate_config` calls the same functions, through `OPTION_CHECKS`,
to list every problem of a configuration at once: a rule is written once, and
each option is declared once (`STEP_OPTIONS`: name, default, check, doc).

    options = resolve_step_options(optimizer, num_towers=4, update="replicated",
                                   precision=towerlib.BFloat16(), bn_mode="sync")
    options.update        # Replicated(pack_bytes=4194304, wire_dtype=None)
    options.exchange      # GraphExchange() on CPU towers, CollectiveExchange() on GPUs
"""

import dataclasses
import math
import numbers
import types
from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

from towerlib.batchnorm.modes import BnMode, resolve_bn_mode
from towerlib.checks.declared_options import Option, OptionTable
from towerlib.checks.problems import Problems, is_int
from towerlib.exchange.choice import ExchangeChoice, resolve_exchange
from towerlib.exchange.group import ONE_WORKER, WorkerGroup
from towerlib.internals import optimizer_settings
from towerlib.precision.choice import Precision, resolve_precision
from towerlib.step import accumulation
from towerlib.step import devices as devices_lib
from towerlib.step import inputs as inputs_lib
from towerlib.step import towers as towers_lib
from towerlib.update.base import UpdateChoice
from towerlib.update.choice import resolve_update
from towerlib.update.clipping import ClipByGlobalNorm, resolve_clipping

__all__ = ["OPTION_CHECKS", "STEP_OPTIONS", "StepOptions", "check_ema_decay",
           "check_exchange_applies", "check_optimizer", "check_step_options",
           "check_workers_apply", "resolve_step_options", "resolve_workers"]


# A Keras optimizer's class name -> the tf.compat.v1.train optimizer with its update.
_TF1_EQUIVALENTS = {
    "SGD": "MomentumOptimizer(learning_rate, momentum) (GradientDescentOptimizer "
           "without momentum)",
    "Adam": "AdamOptimizer(learning_rate, beta1, beta2, epsilon)",
    "RMSprop": "RMSPropOptimizer(learning_rate, decay=rho, momentum, epsilon)",
    "Adagrad": "AdagradOptimizer(learning_rate, initial_accumulator_value)",
    "Adadelta": "AdadeltaOptimizer(learning_rate, rho, epsilon)",
    "Ftrl": "FtrlOptimizer(learning_rate, ...)",
}


def check_optimizer(optimizer):
    """Refuses anything but a tf.compat.v1.train.Optimizer, and a rate that is no number."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        equivalent = _TF1_EQUIVALENTS.get(type(optimizer).__name__)
        if equivalent is not None and type(optimizer).__module__.split(".")[0] in (
                "keras", "tf_keras", "tensorflow"):
            raise TypeError(
                f"optimizer is a Keras {type(optimizer).__name__}, which does not run in "
                f"graph-mode towers. Fix: tf.compat.v1.train.{equivalent}, the closest TF 1 "
                "update (RMSProp's TF 1 mean square starts at 1, Keras' at 0), applied once "
                "per global batch by towerlib.")
        raise TypeError(
            f"optimizer must be a tf.compat.v1.train.Optimizer (e.g. "
            f"tf.compat.v1.train.MomentumOptimizer), got {type(optimizer).__name__}. "
            "Keras optimizers do not run in graph-mode towers. Fix: "
            "tf.compat.v1.train.MomentumOptimizer(0.1, 0.9) or another TF 1 optimizer.")
    held = optimizer_settings.settings(optimizer)
    rate, name = held.get("learning_rate"), type(optimizer).__name__
    if hasattr(rate, "rate_at") and hasattr(rate, "tensor"):
        raise TypeError(
            f"{name}'s learning rate is the schedule "
            f"{type(rate).__name__}, not a rate. Fix: pass rate.tensor(global_step).")
    if isinstance(rate, (str, bytes)):
        raise TypeError(
            f"{name}'s learning rate is the string {rate!r}. Fix: a "
            "number or a float tensor, e.g. 0.1 (a flag read as text: float(value)).")
    if _is_number(rate) and not 0 <= rate < math.inf:  # 0: a step that leaves the weights
        raise ValueError(f"{name}'s learning rate is {rate!r}: every step would be NaN "
                         "or uphill. Fix: a finite number >= 0, e.g. 0.1.")
    momentum = held.get("momentum")
    if _is_number(momentum) and not 0 <= momentum <= 1:
        raise ValueError(f"{name}'s momentum is {momentum!r}, outside [0, 1]: the updates "
                         "would grow without bound. Fix: e.g. momentum=0.9.")


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_ema_decay(ema_decay):
    """Refuses a decay outside (0, 1); None means no moving average."""
    if ema_decay is not None and not (
            isinstance(ema_decay, numbers.Real) and not isinstance(ema_decay, bool)
            and 0.0 < ema_decay < 1.0):
        raise ValueError(f"ema_decay must be in (0, 1) or None, got {ema_decay!r}. "
                         "Fix: e.g. 0.999, or None for no moving average.")


def resolve_workers(workers):
    """A WorkerGroup; None is this process alone."""
    if workers is None:
        return ONE_WORKER
    if not isinstance(workers, WorkerGroup):
        raise TypeError(
            f"workers must be a towerlib.exchange.WorkerGroup or None, got "
            f"{type(workers).__name__}. Fix: towerlib.exchange.WorkerGroup(num_workers, "
            "worker_index), e.g. from towerlib.cluster's ClusterInfo.worker_group.")
    return workers


def check_workers_apply(workers, update):
    """Refuses training across workers with an update that exchanges nothing."""
    if workers.spans_workers and not update.exchanges_gradients:
        raise ValueError(
            f"update={update!r} cannot span {workers.num_workers} workers by itself: "
            "the workers' gradients would never meet. Fix: update=towerlib.Replicated() "
            "(all-reduce across every worker's towers), or parameter servers "
            "through towerlib.cluster.build_sync_train_graph.")


def _check_bool(name):
    """True or False; numpy's bools (np.True_, a mask's element) are bools too."""
    def check(value):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {value!r}. "
                            f"Fix: {name}=True or {name}=False.")
    return check


def _check_inputs(inputs):
    if not callable(inputs):
        inputs_lib.check_global_batch(inputs, 1)


def _check_learning_rate(learning_rate):
    if isinstance(learning_rate, (str, bytes)):
        raise TypeError(f"learning_rate is the string {learning_rate!r}. Fix: a number or "
                        "a float tensor, e.g. 0.1 (a flag read as text: float(value)).")
    if isinstance(learning_rate, numbers.Real) and not isinstance(learning_rate, bool) \
            and not (0 < learning_rate < float("inf")):
        raise ValueError(f"learning_rate must be a positive finite number, got "
                         f"{learning_rate!r}. Fix: e.g. 0.1 (scaled for the global batch).")


def _check_global_step(global_step):
    if global_step is not None and not hasattr(global_step, "assign_add"):
        raise TypeError(f"global_step must be a step variable or None, got "
                        f"{type(global_step).__name__}. Fix: leave it None, or pass "
                        "tf.compat.v1.train.get_or_create_global_step().")


def _check_var_list(var_list):
    if var_list is not None and (isinstance(var_list, (str, bytes))
                                 or not hasattr(var_list, "__iter__")):
        raise TypeError(f"var_list must be a list of variables or None, got "
                        f"{type(var_list).__name__}. Fix: leave it None (the variables "
                        "the towers create), or pass a list of variables.")
    if not isinstance(var_list, (list, tuple)):
        return  # None, or an iterable read once, by the build
    listed = list(var_list)
    if not listed:
        raise ValueError("var_list is empty: nothing would train. Fix: the variables to "
                         "train, or None for every trainable variable the towers create.")
    others = [type(v).__name__ for v in listed if not isinstance(v, tf.Variable)]
    if others:
        raise TypeError(f"var_list holds {others[0]} values, not variables. Fix: a list of "
                        "tf.Variable (e.g. tf.compat.v1.trainable_variables()), or None.")


# build_train_graph's options, each once (towerlib.checks.declared_options): the
# build, validate_config, build_sync_train_graph and docs/api.md's table follow it. The
# towers' count, devices and type have no check of their own: they are judged together
# (towerlib.step.devices.tower_problems).
STEP_OPTIONS = OptionTable("build_train_graph", [
    Option("num_towers", None, None, "how many towers: default one per GPU, else 1"),
    Option("devices", None, None, "the towers' device strings, instead of a count"),
    Option("device_type", None, None, "'gpu', 'cpu', or None (GPUs when there are any)"),
    Option("bn_mode", "first_tower", resolve_bn_mode,
           "how batch norm treats the towers: 'first_tower', 'all_towers' or 'sync'"),
    Option("update", "parameter_server", resolve_update,
           "ParameterServer() or Replicated(): how the gradients reach the variables"),
    Option("precision", "float32", resolve_precision,
           "Float32(), BFloat16() or Float16(loss_scale=...): the towers' compute dtype"),
    Option("exchange", None, resolve_exchange,
           "GraphExchange() or CollectiveExchange(); None chooses by the devices"),
    Option("accumulation_steps", 1, accumulation.check_accumulation_steps,
           "micro-batches per tower in one optimizer step"),
    Option("global_step", None, _check_global_step,
           "the step variable; None: get_or_create_global_step()"),
    Option("ema_decay", None, check_ema_decay,
           "keep an ExponentialMovingAverage of the weights with this decay"),
    Option("learning_rate", None, _check_learning_rate,
           "a tensor or float, only for the 'learning_rate' summary"),
    Option("var_list", None, _check_var_list,
           "the variables to train; None: the trainable ones the towers created"),
    Option("summaries", True, _check_bool("summaries"),
           "add the losses, the learning rate and tower scalars to SUMMARIES"),
    Option("check_isolation", True, _check_bool("check_isolation"),
           "refuse a tower loss that reads another tower's examples"),
    Option("workers", None, resolve_workers,
           "a WorkerGroup: train across worker processes (needs Replicated())"),
    Option("clipping", None, resolve_clipping,
           "None, or ClipByGlobalNorm(clip_norm) on the step's combined gradient"),
])

# The build's arguments and options -> the function that checks each (validate_config
# runs them one by one, to list every problem at once).
OPTION_CHECKS = types.MappingProxyType({
    "tower_fn": towers_lib.as_tower_fn,
    "inputs": _check_inputs,
    "optimizer": check_optimizer,
    **STEP_OPTIONS.checks(),
})


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """Every option of a build, checked and resolved to its object.

    Attributes:
      devices: the tower device strings, tower 0 first.
      update, precision: the UpdateChoice and Precision.
      exchange: the ExchangeChoice when towers exchange anything, else None.
      bn_mode, accumulation_steps, ema_decay: as given, checked.
      workers: the WorkerGroup the exchange spans (ONE_WORKER on one machine).
    """

    devices: Tuple[str, ...]
    bn_mode: BnMode
    update: UpdateChoice
    precision: Precision
    exchange: Optional[ExchangeChoice]
    accumulation_steps: int
    ema_decay: Optional[float]
    workers: WorkerGroup = ONE_WORKER
    clipping: Optional[ClipByGlobalNorm] = None


def check_exchange_applies(exchange, bn_mode, update):
    """Refuses an exchange chosen where nothing crosses between the towers (bn_mode: a
    resolved BnMode)."""
    if exchange is not None and not bn_mode.normalizes_globally \
            and not update.exchanges_gradients:
        raise ValueError(
            f"exchange={exchange!r} has no effect: with bn_mode={bn_mode!r} and "
            f"update={update!r} nothing crosses between the towers. Fix: Drop exchange, "
            "or use bn_mode='sync' or update=towerlib.Replicated().")


def check_step_options(problems, given, *, optimizer=None, tower_fn=None, inputs=None,
                       global_batch_size=None, towers=None):
    """Every option in `given` through its own check, then the rules between them.

    The one combiner of the build's options: resolve_step_options raises what it
    collects, validate_config reports it. `given` maps STEP_OPTIONS names to values
    (an option left out takes its default where a rule needs it); the build's
    arguments are checked when not None. Problems go to `problems`
    (towerlib.checks.problems.Problems); returns {option: resolved object} of the
    options whose check passed (the value itself where the check only judges).
    """
    arguments = {"tower_fn": tower_fn, "inputs": inputs, "optimizer": optimizer}
    resolved = {}
    for name, value in [*((n, v) for n, v in arguments.items() if v is not None),
                        *given.items()]:
        check = OPTION_CHECKS.get(name)
        if check is None:
            continue
        before = len(problems.problems)
        checked = problems.attempt(name, check, value)
        if len(problems.problems) == before:  # a check that only judges returns None
            resolved[name] = value if checked is None else checked
    _check_rules_between(problems, resolved, given, global_batch_size, towers)
    return resolved


def _check_rules_between(problems, resolved, given, global_batch_size, towers):
    """The rules that join options, each judged only when its options passed."""
    def chosen(name):  # a rule's option: resolved, else its default's object
        if name in resolved:
            return resolved[name]
        return None if name in given else STEP_OPTIONS[name].check(STEP_OPTIONS[name].default)
    update, bn_mode = chosen("update"), chosen("bn_mode")
    if "precision" in resolved and "optimizer" in resolved:
        problems.attempt("precision", resolved["precision"].check_optimizer,
                         resolved["optimizer"])
    if resolved.get("workers") is not None and update is not None:
        problems.attempt("workers", check_workers_apply, resolved["workers"], update)
    if resolved.get("exchange") is not None and update is not None and bn_mode is not None:
        problems.attempt("exchange", check_exchange_applies, resolved["exchange"], bn_mode,
                         update)
    steps = resolved.get("accumulation_steps")
    if steps and is_int(global_batch_size) and global_batch_size >= 1:
        # Without the tower count, every micro-batch needs one example at least.
        problems.attempt("accumulation_steps", accumulation.check_batch_covers_micro_batches,
                         global_batch_size, steps, towers or 1)


def resolve_step_options(optimizer, *, tower_fn=None, **options) -> StepOptions:
    """Checks every build option and resolves them; raises what check_step_options found
    (one problem as its check raised it, several as one towerlib.ConfigError).

    `options` are STEP_OPTIONS by name (the rest take their defaults): the one
    resolver of build_train_graph's options.
    """
    values = STEP_OPTIONS.with_defaults(options)
    problems = Problems()
    resolved = check_step_options(problems, values, optimizer=optimizer, tower_fn=tower_fn)
    problems.raise_all()
    update, workers, bn_mode = resolved["update"], resolved["workers"], resolved["bn_mode"]
    devices = devices_lib.resolve_devices(values["num_towers"], values["devices"],
                                          values["device_type"])
    needs_exchange = bn_mode.normalizes_globally or update.exchanges_gradients
    return StepOptions(
        devices=tuple(devices), bn_mode=bn_mode, update=update,
        precision=resolved["precision"],
        exchange=(resolve_exchange(values["exchange"], devices, workers) if needs_exchange
                  else None),
        accumulation_steps=resolved["accumulation_steps"], ema_decay=values["ema_decay"],
        workers=workers, clipping=resolved["clipping"])
