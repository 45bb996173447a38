"""Which part of a training step an op belongs to, and which tower ran it.

Every op of a traced step gets one phase, from its node name's scopes and
its op type, by the first rule that matches:

  'exchange'  between towers: sync batch norm's statistics and the
              replicated all-reduce. Op types Collective* and Nccl*/_Nccl*;
              or a scope containing 'cross_tower' (towerlib's
              'cross_tower_exchange/<name>/gather|sum' hub ops and the
              '<name>_cross_tower_sum|gather|gather_unordered' packing in
              each tower), 'allreduce' or 'all_reduce'
              ('allreduce_gradients/allreduce_tower_<i>/'), 'exchange' or
              'sync_bn'. The rest of a tower's 'sync_batch_norm' scope is the
              tower's own arithmetic (the same as 'batch_norm' in the other
              modes) and stays 'compute'.
  'input'     reading and splitting the batch. Iterator and queue op types
              (IteratorGetNext, ...: their time includes waiting for data);
              scopes 'split_global_batch', 'micro_batches',
              'micro_batch_<j>_tower_<i>_input', and 'input' directly under a
              tower scope.
  'apply'     gradient aggregation and the update. Op types *Apply*
              (ResourceApplyMomentum, ...); a first scope that is an
              optimizer's name (GradientDescent, Momentum, Adam, ... with an
              optional '_<n>'): the optimizer's group op and its 'update_<var>',
              'update_replicated/tower_<i>' and global_step increment; scopes
              'aggregate_gradients', 'accumulate_tower_<i>',
              'batch_norm_updates', 'apply_gradients', 'train_op',
              'global_step', 'ExponentialMovingAverage', 'loss_scale',
              'numerics_guard', 'sync_replicas'.
  'compute'   anything else inside a tower's scope: the forward and
              backward passes.
  'other'     the rest: variables, regularizers, the reported loss, summaries.

A tower's scope is a name part 'tower_<i>' or one ending '_tower_<i>' or
containing '_tower_<i>_': 'tower_1/conv1/Conv2D',
'micro_batch_0/tower_1/...', 'replicated/tower_1/...',
'accumulation/micro_batch_loop/body/_1/tower_1/...' (the accumulation loop),
'allreduce_gradients/allreduce_tower_1/...',
'GradientDescent/update_replicated/tower_1/...'; the first such part names
the tower.

PRIORITY is the order in which the step's time is split among phases when
several run at once: exchange > apply > input > compute > other (the rarer,
step-serializing work first, so that a little exchange under a lot of
compute is not hidden by it).
"""

import re
from typing import Optional, Sequence

__all__ = ["COMPUTE", "EXCHANGE", "APPLY", "INPUT", "OTHER", "PHASES", "PRIORITY",
           "classify", "tower_index"]

EXCHANGE = "exchange"
APPLY = "apply"
INPUT = "input"
COMPUTE = "compute"
OTHER = "other"

# The phases in report order, and their priority in the partition of the step.
PHASES = (COMPUTE, EXCHANGE, APPLY, INPUT, OTHER)
PRIORITY = (EXCHANGE, APPLY, INPUT, COMPUTE, OTHER)

_TOWER = re.compile(r"(?:^|_)tower_(\d+)(?:$|_)")

_EXCHANGE_TYPE_PREFIXES = ("Collective", "Nccl", "_Nccl")
_EXCHANGE_WORDS = ("cross_tower", "allreduce", "all_reduce", "exchange", "sync_bn")

_INPUT_TYPES = frozenset({
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
    "MultiDeviceIteratorGetNextFromShard", "IteratorV2", "Iterator", "MakeIterator",
    "OneShotIterator", "AnonymousIterator", "AnonymousIteratorV2",
    "AnonymousIteratorV3", "IteratorToStringHandle", "IteratorFromStringHandle",
    "IteratorFromStringHandleV2", "QueueDequeue", "QueueDequeueV2", "QueueDequeueMany",
    "QueueDequeueManyV2", "QueueDequeueUpTo", "QueueDequeueUpToV2", "ReaderReadV2",
    "ReaderReadUpToV2"})
_INPUT_SCOPES = frozenset({"split_global_batch", "micro_batches"})
_MICRO_BATCH_INPUT = re.compile(r"^micro_batch_\d+_tower_\d+_input$")

_APPLY_TYPE = re.compile(r"^(?:Resource)?(?:Sparse)?Apply[A-Z]")
_OPTIMIZERS = frozenset({
    "GradientDescent", "Momentum", "Adam", "Adagrad", "AdagradDA", "Adadelta",
    "RMSProp", "Ftrl", "ProximalGradientDescent", "ProximalAdagrad", "Adamax",
    "Nadam", "LazyAdam", "LARS", "Lamb", "SyncReplicas"})
_OPTIMIZER_SCOPE = re.compile(r"^(?P<name>[A-Za-z]+)(?:_\d+)?$")
_APPLY_SCOPES = frozenset({
    "aggregate_gradients", "batch_norm_updates", "apply_gradients", "train_op",
    "global_step", "ExponentialMovingAverage", "loss_scale", "numerics_guard",
    "sync_replicas"})
_ACCUMULATE = re.compile(r"^accumulate_tower_\d+$")


def _parts(name: str) -> Sequence[str]:
    return name.partition(":")[0].split("/")


def tower_index(name: str) -> Optional[int]:
    """The tower whose scope holds op `name` ('micro_batch_1/tower_2/x' -> 2), or None."""
    for part in _parts(name):
        match = _TOWER.search(part)
        if match:
            return int(match.group(1))
    return None


def _is_exchange(parts, op_type):
    if op_type.startswith(_EXCHANGE_TYPE_PREFIXES):
        return True
    return any(word in part.lower() for part in parts for word in _EXCHANGE_WORDS)


def _is_input(parts, op_type):
    if op_type in _INPUT_TYPES:
        return True
    for position, part in enumerate(parts):
        if part in _INPUT_SCOPES or _MICRO_BATCH_INPUT.match(part):
            return True
        if part == "input" and position and _TOWER.search(parts[position - 1]):
            return True
    return False


def _is_apply(parts, op_type):
    if _APPLY_TYPE.match(op_type):
        return True
    optimizer = _OPTIMIZER_SCOPE.match(parts[0])
    if optimizer and optimizer["name"] in _OPTIMIZERS:
        return True
    return any(part in _APPLY_SCOPES or _ACCUMULATE.match(part) for part in parts)


def classify(name: str, op_type: str = "") -> str:
    """The phase of op `name` of type `op_type` (rules in the module doc)."""
    parts = _parts(name)
    if _is_exchange(parts, op_type):
        return EXCHANGE
    if _is_input(parts, op_type):
        return INPUT
    if _is_apply(parts, op_type):
        return APPLY
    if tower_index(name) is not None:
        return COMPUTE
    return OTHER
