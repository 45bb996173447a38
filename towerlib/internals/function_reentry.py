"""Re-entering a function graph that is already the default, at a plain graph's price.

TensorFlow's op wrappers re-enter the graph an op goes to as the default
for every op they build (``op_def_library._apply_op_helper`` runs
``with g.as_default():``). Inside a function body that graph is the body
itself, and ``FuncGraph.as_default`` does more than ``Graph.as_default``:
it copies the enclosing default graph's distribution-strategy, device
(when it holds a device function) and variable-creator stacks into the
body (and its graph key), gives it a fresh list of scope-exit callbacks,
and puts all of them back on exit. When the body is already the default,
the graph it copies from is the body itself, so the copies change nothing
that outlives the entry; they cost ~10 us per op, ~0.3 s of the 38k ops of
8 towers' accumulation loop (towerlib.step.micro_loop). One difference: a
scope-exit callback registered during a skipped entry runs when the body's
own entry ends instead (TensorFlow registers them only for tf_should_use's
error_in_function, which nothing in TensorFlow sets).

Within ``plain_reentry(graph)`` such an entry is ``Graph.as_default``; an
entry while another graph is the default still takes FuncGraph's path.
Only `graph` (one object) is changed, by an instance attribute that
shadows the class's method, removed on exit. Relies on FuncGraph's
``as_default`` being an ordinary method of the class, and on what its
entry (``func_graph._func_graph_as_default_inner_cm``) sets: a test fails
when either changes.
"""

import contextlib
import inspect

import tensorflow as tf

__all__ = ["plain_reentry"]


@contextlib.contextmanager
def plain_reentry(graph: tf.Graph):
    """Within: re-entering `graph` (a FuncGraph) while it is the default costs what a Graph's does.

        def body(index):
            with plain_reentry(tf.compat.v1.get_default_graph()):
                ...  # build the towers: each op's wrapper re-enters the body cheaply
    """
    if not hasattr(graph, "outer_graph") or not inspect.ismethod(graph.as_default):
        yield  # not a function graph, or already shortcut by an enclosing entry
        return
    own_entry = type(graph).as_default

    def as_default():
        if tf.compat.v1.get_default_graph() is graph:
            return tf.Graph.as_default(graph)
        return own_entry(graph)

    graph.as_default = as_default
    try:
        yield
    finally:
        del graph.as_default
