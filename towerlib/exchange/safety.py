"""Run-time safety for collectives: fetch checks, deadlines, clear errors.

A collective waits for every member of its group. The reducer's pairing
(towerlib.exchange.ledger) stops a mismatch at build time; what is left can
only show when a graph runs, and these keep it from becoming a silent hang:

  * before a run, ``check_fetches(fetches)`` (or the
    ``CollectiveFetchCheckHook`` of towerlib.run.hooks in a MonitoredSession)
    finds the collectives a ``session.run`` would execute and raises if some
    tower's half of one is missing, which is what fetching only tower 0's
    loss does;
  * at run time, a deadline bounds whatever is left: the Session's
    ``operation_timeout_in_ms`` (see ``bounded_session_config``) or
    RunOptions(timeout_in_ms); ``explain_collective_errors()`` turns the
    resulting error into a ``CollectiveTimeoutError`` that says what happened
    and what to do. Collective ops also take their own ``timeout_seconds``,
    but in TF 2.21 each such op starts a thread per step that sleeps for the
    whole timeout (measured: 336 collectives a step at a 300 s timeout pile
    up thousands of threads within a minute), so it is off by default.

The graph transport needs none of this: a graph edge cannot wait for a tower
that is not run.
"""

import contextlib
from typing import Optional

import tensorflow as tf

from towerlib.exchange import keys
from towerlib.internals import collective_ops, error_texts

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS", "CollectiveTimeoutError", "PartialFetchError",
    "PeerTimeoutError",
    "bounded_session_config", "check_fetches", "explain_collective_errors",
    "graph_elements", "has_towerlib_collectives",
]

# A session.run that takes longer than this fails instead of hanging, when
# the Session is configured by bounded_session_config. Generous on purpose: a
# tower may lag behind the others by a whole step on the first run (graph
# start-up, autotuning, input warm-up), and an expired deadline while the
# collectives are still forming their group aborts the Session's collectives.
DEFAULT_TIMEOUT_SECONDS = 300.0


class PartialFetchError(ValueError):
    """A session.run would run only some towers' halves of a collective."""


class PeerTimeoutError(TimeoutError):
    """towerlib waited for another task (a worker, a ps task, the chief) longer than
    its bound: restarting every task fixes it (exit status 138, towerlib.cluster.exits).
    A TimeoutError, so that code catching that keeps working; a user's own
    TimeoutError is not one, and keeps its meaning."""


class CollectiveTimeoutError(tf.errors.DeadlineExceededError):
    """A cross-tower collective waited longer than its timeout for its peers."""

    def __init__(self, original, message):
        super().__init__(original.node_def, original.op, message)
        self.original = original


def graph_elements(fetches, graph):
    """The ops and tensors of `graph` named by a nest of fetches."""
    elements = []
    for fetch in tf.nest.flatten(fetches, expand_composites=True):
        if fetch is None:
            continue
        try:
            elements.append(graph.as_graph_element(fetch, allow_tensor=True, allow_operation=True))
        except (TypeError, ValueError):
            continue  # not a graph element of this graph: session.run will say so
    return elements


def check_fetches(fetches, feed_dict=None, graph=None) -> None:
    """Raises PartialFetchError if running `fetches` would hang on a collective.

    Walks the part of the graph that ``session.run(fetches, feed_dict)`` would
    execute (data and control inputs, stopping at fed tensors) and groups the
    collective ops it meets by (group key, instance key). A collective of a
    group of T towers completes only when all T of its ops run; if the run
    holds fewer than the graph has (all T, or across workers this worker's
    own), it would wait forever (or until a deadline). The typical
    cause is fetching one tower's tensors alone, e.g. ``train.tower_losses[0]``.

    Cost: one walk over the fetched subgraph (milliseconds for a ResNet on 8
    towers); ``towerlib.run.hooks.CollectiveFetchCheckHook`` caches the answer per
    fetch set.

    Args:
      fetches: what would be passed to session.run (a nest of tensors,
        operations, variables or their names).
      feed_dict: its feeds; fed tensors cut the walk.
      graph: the graph (default: the default graph).
    """
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    fed = {id(t) for t in graph_elements(list(feed_dict or {}), graph)}
    stack = []
    for element in graph_elements(fetches, graph):
        if id(element) in fed:
            continue
        stack.append(element.op if isinstance(element, tf.Tensor) else element)
    seen, members = set(), {}
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if collective_ops.is_collective_op(op):
            key = (op.get_attr("group_key"), op.get_attr("instance_key"))
            members.setdefault(key, []).append(op)
        for tensor in op.inputs:
            if id(tensor) not in fed:
                stack.append(tensor.op)
        stack.extend(op.control_inputs)
    in_graph = _collective_ops_in(graph) if members else {}
    for (group_key, instance_key), ops in sorted(members.items()):
        # Across workers this graph holds only this worker's members.
        group_size = min(ops[0].get_attr("group_size"),
                         in_graph.get((group_key, instance_key), 0))
        if len(ops) < group_size:
            names = sorted(op.name for op in ops)
            raise PartialFetchError(
                f"This session.run would run {len(ops)} of the {group_size} ops of "
                f"a cross-tower collective (group {group_key}, instance "
                f"{instance_key}): {names}. A collective completes only when every "
                "tower's op runs in the same session.run, so this run would wait "
                "for the missing towers forever. The fetches need only some "
                "towers (e.g. tower 0's loss or outputs alone): fetch the train "
                "op, or tensors of every tower (TrainGraph.loss needs them all); "
                "for per-tower inspection build an evaluation graph "
                "(build_towers with is_training=False), which has no collectives."
            )


def _collective_ops_in(graph):
    """{(group key, instance key): how many of its ops `graph` holds}."""
    counts = {}
    for op in graph.get_operations():
        if collective_ops.is_collective_op(op):
            key = (op.get_attr("group_key"), op.get_attr("instance_key"))
            counts[key] = counts.get(key, 0) + 1
    return counts


def bounded_session_config(config=None, timeout_seconds=DEFAULT_TIMEOUT_SECONDS):
    """A copy of `config` whose session.run calls fail after `timeout_seconds`.

    Sets ConfigProto.operation_timeout_in_ms, the Session's default deadline
    for every run (RunOptions.timeout_in_ms overrides it per run). Unlike the
    collectives' own timeout, it costs no thread. It bounds whole steps, not
    just collectives, so keep it well above the slowest legitimate step
    (the first one included).

    Args:
      config: a tf.compat.v1.ConfigProto, e.g. towerlib.session_config(n);
        None starts from an empty one.
      timeout_seconds: the deadline of one session.run.
    """
    if not timeout_seconds > 0:
        raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds!r}.")
    bounded = tf.compat.v1.ConfigProto()
    if config is not None:
        bounded.CopyFrom(config)
    bounded.operation_timeout_in_ms = int(timeout_seconds * 1000)
    return bounded


def has_towerlib_collectives(graph) -> bool:
    """Whether `graph` holds collectives of a CrossTowerReducer (bn_mode='sync').

    Recognized by group key, not by op name, so other collectives in the
    graph do not count (see towerlib.exchange.keys.is_towerlib_group_key).
    """
    if any(collective_ops.is_collective_op(op)
           and keys.is_towerlib_group_key(graph, op.get_attr("group_key"))
           for op in graph.get_operations()):
        return True
    # An accumulation loop's body (sync batch norm) is a function of the graph.
    return any(
        node.op in collective_ops.COLLECTIVE_OP_TYPES and "group_key" in node.attr
        and keys.is_towerlib_group_key(graph, node.attr["group_key"].i)
        for function in graph.as_graph_def().library.function for node in function.node_def)


@contextlib.contextmanager
def explain_collective_errors(graph: Optional[tf.Graph] = None):
    """Re-raises a collective timeout from session.run with an explanation.

        with explain_collective_errors():
          session.run(train_op)

    A DeadlineExceededError (or CancelledError) raised by a collective op
    becomes a CollectiveTimeoutError whose message names the op that waited,
    the likely causes and the fix. So does an expired run deadline
    (RunOptions.timeout_in_ms, ConfigProto.operation_timeout_in_ms) when
    `graph` (default: the default graph at entry) holds towerlib collectives,
    since that error does not name the op still running. Other errors pass
    through unchanged.
    """
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    try:
        yield
    except (tf.errors.DeadlineExceededError, tf.errors.CancelledError) as error:
        text = error.message or ""
        if isinstance(error, CollectiveTimeoutError):
            raise
        if error_texts.is_collective_timeout(text):
            node = error.op.name if error.op is not None else "a collective op"
            opening = (
                f"Cross-tower collective {node} did not complete: it waited "
                "for the other towers longer than its timeout."
            )
        elif error_texts.is_run_deadline(text) and has_towerlib_collectives(graph):
            opening = (
                "session.run hit its deadline (RunOptions.timeout_in_ms or "
                "ConfigProto.operation_timeout_in_ms) in a graph with "
                "cross-tower collectives; most likely a "
                "collective was waiting for towers that this run never "
                "started."
            )
        else:
            raise
        message = opening + (
            " Every tower's collectives must run in the same session.run. Likely "
            "causes: (1) the fetches need only some towers (e.g. tower 0's loss "
            "or outputs alone): fetch the train op, or tensors of every tower "
            "(towerlib.exchange.check_fetches finds this before running); "
            "(2) the towers built different sequences of synchronized layers "
            "(call CrossTowerReducer.check_consistent() after building them); (3) "
            "one tower is stalled, e.g. waiting on its input: raise the "
            "deadline if it is just slow. After such a timeout the "
            "Session's collectives may stay aborted (every later run fails with "
            '"Collective ops is aborted"): create a new Session.'
        )
        message += f"\nOriginal error: {error_texts.timeout_line(text)}"
        raise CollectiveTimeoutError(error, message) from error
