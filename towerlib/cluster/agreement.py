"""Workers agree on the step they build, before the first step.

All-reduce workers each build the training step from their own flags. Built
from different flags (a learning rate, a tower count, a model) they would
exchange gradients of different steps: the copies drift apart without a word,
or a collective waits for tensors that never come until the step deadline
blames a slow worker. So each worker describes its step (`describe_step`: the
model's variables, the optimizer and the hyperparameters that can be read,
the tower count, every build option), the descriptions are exchanged in one
all-gather at startup, and a difference from the chief's stops every worker
with one line naming the item and both values:

    Worker 1 builds another step than the chief: its optimizer learning_rate is
    0.2, the chief's 0.1. Fix: start every worker with the same flags.

What cannot be read (a learning rate computed by a schedule tensor) is
compared by its kind only; the shares of the global batch may differ by design.
Each towerlib.global_batch_input is described by its seed, global batch,
number of examples and source fingerprint: workers reading other data, or
in another order, would train on batches no one chose:

    Worker 1 builds another step than the chief: its input 'global_batches'
    examples is 90, the chief's 100. Fix: give every worker the same data ...
"""

import copy
import hashlib
import json
import numbers

import numpy as np
import tensorflow as tf

from towerlib.internals import collective_ops
from towerlib.run import global_batches
from towerlib.step import across_workers
from towerlib.update import slot_shards

# The startup exchange's collective group: apart from the training graph's.
_GROUP_KEY = 0x7B0003
# Bytes of one worker's description; a longer one has its long items hashed.
_MAX_BYTES = 8192
_MAX_ITEM_CHARS = 200


def _value_text(value):
    """A short, process-independent text for an option's value."""
    if isinstance(value, (bool, np.bool_)):   # np.True_ is the same setting as True
        return repr(bool(value))
    if value is None or isinstance(value, str):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Number):
        return repr(float(value)) if isinstance(value, numbers.Real) else repr(value)
    if isinstance(value, (tf.Tensor, tf.Variable)):
        static = tf.get_static_value(value) if isinstance(value, tf.Tensor) else None
        if static is not None and np.ndim(static) == 0:
            return repr(float(static))
        return f"a {value.dtype.name} tensor"
    text = repr(value)
    if " at 0x" in text:  # an object without a value repr: its type is what is shared
        return type(value).__name__
    return text


def _optimizer_items(optimizer, prefix="optimizer"):
    """{'optimizer': class, 'optimizer learning_rate': value, ...}, wrappers unwrapped."""
    items = {prefix: type(optimizer).__name__}
    for name, value in sorted(vars(optimizer).items()):
        if isinstance(value, tf.compat.v1.train.Optimizer):
            items.update(_optimizer_items(value, f"{prefix} {name.strip('_')}"))
        elif isinstance(value, (numbers.Number, tf.Tensor)) and not name.endswith("_t"):
            items[f"{prefix} {name.strip('_')}"] = _value_text(value)
    return items


def describe_step(train_graph, optimizer, build_options):
    """{item: text} of what defines this worker's step (see the module docstring)."""
    graph = tf.compat.v1.get_default_graph()
    # A slot sharded over the workers is on its owner only: described by its shard.
    sharded = slot_shards.sharded_names(graph)
    variables = sorted([(v.op.name, str(v.shape), v.dtype.base_dtype.name)
                        for v in tf.compat.v1.global_variables()
                        if "/tower_" not in v.op.name and v.op.name not in sharded]
                       + [(s.name, str(s.shape), s.dtype.name)
                          for s in slot_shards.shards_of(graph)])
    digest = hashlib.sha256(json.dumps(variables).encode()).hexdigest()[:12]
    items = {"number of towers": str(len(train_graph.devices)),
             "model variables": f"{len(variables)} variables (digest {digest})"}
    fixed = tf.compat.v1.get_collection(across_workers.FIXED_SUMS)
    items["examples per step"] = ("static, exchanged once at start" if fixed else
                                  "read every step (a batch size that is not static)")
    items.update(_optimizer_items(optimizer))
    for name, value in sorted(build_options.items()):
        if name not in ("global_step", "device_function", "learning_rate"):
            items[f"option {name}"] = _value_text(value)
    items.update(_input_items(train_graph.train_op.graph))
    return {name: text if len(text) <= _MAX_ITEM_CHARS else
            "digest " + hashlib.sha256(text.encode()).hexdigest()[:12]
            for name, text in items.items()}


def _input_items(graph):
    """{'input <name> seed': ..., global batch, examples, source fingerprint}."""
    items = {}
    for built in global_batches.inputs_of(graph):
        prefix = f"input {built.name!r}"
        items.update({f"{prefix} seed": str(built.seed),
                      f"{prefix} global batch": str(built.global_batch_size),
                      f"{prefix} examples": str(built.num_examples),
                      f"{prefix} source fingerprint": f"{built.fingerprint & (2**64 - 1):016x}"})
    return items


def _compared_first(item):
    """A seed first: another seed is the cause, the data's other figures its symptoms."""
    return (not item.endswith(" seed"), item)


def describe_loop(max_steps, run_kwargs, saves_together=False):
    """{item: text} of the loop options every worker must share: where it stops, when
    it saves (a restart needs a step all saved), what it evaluates and when; with
    `saves_together` (slots sharded over the workers: every save is an exchange),
    whether it keeps the best checkpoint too."""
    items = {"max_steps": _value_text(max_steps),
             "save_checkpoint_steps": _value_text(run_kwargs.get("save_checkpoint_steps"))}
    evaluation = run_kwargs.get("evaluation")
    if evaluation is not None:
        names = ["every_n_steps", "metric", "higher_is_better", "patience", "min_delta",
                 "num_batches"] + (["keep_best"] if saves_together else [])
        for name in names:
            items[f"evaluation {name}"] = _value_text(getattr(evaluation, name))
    return items


def _encoded(description):
    data = json.dumps(description, sort_keys=True).encode()
    if len(data) > _MAX_BYTES:
        data = json.dumps({"description": "digest " + hashlib.sha256(
            data).hexdigest()}).encode()
    row = np.zeros([_MAX_BYTES], np.int32)
    row[:len(data)] = np.frombuffer(data, np.uint8)
    return row


def _decoded(row):
    return json.loads(bytes(np.asarray(row[row > 0], np.uint8)).decode())


def first_difference(descriptions):
    """(worker, item, its text, the chief's text) of the first difference, or None.

    descriptions[0] is the chief's.
    """
    chief = descriptions[0]
    for worker, own in enumerate(descriptions[1:], start=1):
        for item in sorted(set(chief) | set(own), key=_compared_first):
            if own.get(item) != chief.get(item):
                return worker, item, own.get(item, "missing"), chief.get(item, "missing")
    return None


def check_workers_agree(cluster, server, session_config, description, timeout_secs):
    """Raises ValueError on every worker when a worker's step differs from the chief's.

    One all-gather of every worker's description, in a session of its own.
    """
    workers = cluster.num_replicas
    with tf.Graph().as_default():
        with tf.device(f"{cluster.task_device}/device:CPU:0"):
            gathered = collective_ops.all_gather(
                tf.constant(_encoded(description)), workers, _GROUP_KEY, 1, "auto")
        config = copy.deepcopy(session_config)
        config.operation_timeout_in_ms = int(timeout_secs * 1000)
        with tf.compat.v1.Session(server.target, config=config) as session:
            rows = session.run(gathered).reshape([workers, _MAX_BYTES])
    difference = first_difference([_decoded(row) for row in rows])
    if difference is not None:
        worker, item, own, chief = difference
        fix = ("give every worker the same data (the same files or arrays, in the same "
               "order), seed and global batch" if item.startswith("input ") else
               "start every worker with the same flags (the same model, optimizer, "
               "towers and options); only the data shard differs")
        raise ValueError(f"Worker {worker} builds another step than the chief: its {item} "
                         f"is {own}, the chief's {chief}. Fix: {fix}.")
