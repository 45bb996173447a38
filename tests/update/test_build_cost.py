"""What a replicated build adds to the graph over a parameter server's.

Node counts, not times: deterministic, and what the build time follows (a
graph's nodes cost about the same to build whoever makes them). A replicated
build needs a copy of every variable and slot per tower and an apply per
copy; it must not need more per copy than that:

  - a copy is its variable's 4 ops (handle, is-initialized, assign, read),
    initialized from the read TensorFlow made of tower 0's variable;
  - sync_copies_op runs the copies' initializers again (no op per copy);
  - through the graph transport, the all-reduce's buffer is cut into
    gradients once, next to the hub, and every tower applies those.

Before: 1.82x the parameter server's nodes at 4 towers on conv_bn_model
(3 reads, 2 identities, 1 assign per copy for the initializer and the sync,
a split and reshapes per tower for each buffer); after: 1.35x.
"""

import collections

import tensorflow as tf

from tests import helpers

NUM_TOWERS = 4


def _build(update, model=helpers.conv_bn_model, num_towers=NUM_TOWERS):
    graph = tf.Graph()
    with graph.as_default():
        train = helpers.build_on_image_batch(num_towers, tower_fn=model,
                                             optimizer_kind="momentum", update=update,
                                             batch_size=16)
    return graph, train


def _node_count(graph):
    return len(graph.as_graph_def().node)


def test_replicated_builds_at_most_1_6_times_the_parameter_servers_nodes():
    ps_graph, _ = _build("parameter_server")
    replicated_graph, _ = _build("replicated")
    ps, replicated = _node_count(ps_graph), _node_count(replicated_graph)
    assert replicated <= 1.6 * ps, (replicated, ps, replicated / ps)


def test_a_copy_is_its_variables_four_ops_initialized_from_tower_0s_own_read():
    graph, train = _build("replicated")
    copies = [copy for copies in train.variable_copies.values() for copy in copies[1:]]
    assert len(copies) > 10
    by_copy = collections.Counter()
    for op in graph.get_operations():
        for copy in copies:
            if op.name.startswith(copy.op.name + "/") or op.name == copy.op.name:
                by_copy[copy.op.name] += 1
    # Slots are named after their copy ('.../weights/Momentum'): count the weight's own.
    own = {name: count - sum(by_copy[other] for other in by_copy
                             if other.startswith(name + "/"))
           for name, count in by_copy.items()}
    assert set(own.values()) == {4}, own
    for name, variables in train.variable_copies.items():
        tower_0 = variables[0]
        values = {copy.initializer.inputs[1].name for copy in variables[1:]}
        assert values == {f"{tower_0.op.name}/Read/ReadVariableOp:0"}, (name, values)


def test_sync_copies_op_reruns_the_copies_initializers():
    graph, train = _build("replicated")
    reached, stack = set(), [train.sync_copies_op]
    while stack:
        op = stack.pop()
        for dependency in op.control_inputs:
            if dependency.type == "NoOp":
                stack.append(dependency)
            else:
                reached.add(dependency.name)
    initializers = {copy.initializer.name for copies in train.variable_copies.values()
                    for copy in copies[1:]}
    assert reached == initializers
    assert not [op for op in graph.get_operations()
                if op.name.startswith("copy_tower_0_to_every_tower") and op.type != "NoOp"]


def test_every_copy_applies_the_same_summed_gradient_tensor():
    graph, train = _build("replicated")
    applied = collections.defaultdict(set)
    for op in graph.get_operations():
        if op.type == "ResourceApplyMomentum":
            variable = op.inputs[0].op.name
            applied[variable].add(op.inputs[3].name)
    by_copy = {copy.op.name: name for name, copies in train.variable_copies.items()
               for copy in copies}
    gradients = collections.defaultdict(set)
    for variable, tensors in applied.items():
        gradients[by_copy[variable]] |= tensors
    assert len(gradients) == len(train.grads_and_vars)
    assert all(len(tensors) == 1 for tensors in gradients.values()), gradients
    # Cut once per buffer: one split per all-reduce exchange, not one per tower.
    splits = [op for op in graph.get_operations()
              if op.type == "SplitV" and op.name.startswith("allreduce_gradients/")]
    hubs = [op for op in graph.get_operations()
            if op.type == "AddN" and op.name.startswith("cross_tower_exchange")]
    assert len(splits) <= len(hubs)
