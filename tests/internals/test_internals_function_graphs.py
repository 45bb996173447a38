"""towerlib.internals.function_graphs: a while-loop body's captures, seen from outside.

The accumulation loop (towerlib.step.micro_loop) relies on these behaviours of
TF's graph-mode while_loop (control flow v2); each test fails naming the
module if a release changes one.
"""

import pytest
import tensorflow as tf

from towerlib.internals import collective_ops, function_graphs


def _broken(detail):
    pytest.fail(f"TensorFlow {tf.__version__}: towerlib.internals.function_graphs relies on "
                f"{detail}", pytrace=False)


def _in_body(build):
    """Runs build() once inside a one-iteration while_loop body; returns what it saw."""
    seen = {}

    def body(index):
        seen.update(build(index))
        return index + 1

    tf.compat.v1.while_loop(lambda index: index < 1, body, [tf.constant(0)])
    return seen


def test_a_capture_leads_back_to_the_outer_tensor_and_graph():
    with tf.Graph().as_default() as graph:
        outer = tf.constant([1.0, 2.0], name="outer")
        seen = _in_body(lambda index: {"inner": outer * 2.0,
                                       "graph": tf.compat.v1.get_default_graph()})
        if getattr(seen["graph"], "outer_graph", None) is None:
            _broken("the body being a FuncGraph with an outer_graph")
        placeholder = seen["inner"].op.inputs[0].op
        assert function_graphs.captured_from(placeholder) is outer
        assert function_graphs.captured_from(outer.op) is None
        assert function_graphs.is_inside(seen["graph"], graph)
        assert not function_graphs.is_inside(tf.Graph(), graph)


def test_a_copied_op_runs_only_in_the_branch_it_was_copied_into():
    with tf.Graph().as_default():
        counter = tf.Variable(0, name="counter")

        def build(index):
            original = counter.assign_add(1, read_value=False)  # nothing depends on it

            def copy():
                with tf.control_dependencies([function_graphs.copy_op(original, "once")]):
                    return tf.constant(True)

            done = tf.cond(tf.equal(index, 0), copy, lambda: tf.constant(False))
            return {"done": done}

        def body(index):
            done = build(index)["done"]
            with tf.control_dependencies([done]):
                return index + 1

        loop = tf.compat.v1.while_loop(lambda index: index < 3, body, [tf.constant(0)])
        with tf.compat.v1.Session() as session:
            session.run(counter.initializer)
            session.run(loop)
            if session.run(counter) != 1:
                _broken("a body op nothing depends on never running, and a copy made by "
                        f"Graph.create_op in a tf.cond branch running with it: counter "
                        f"{session.run(counter)} after 3 iterations, not 1")


def test_collectives_in_a_loop_pair_up_per_iteration():
    """Sync batch norm in the accumulation loop: TF keys a collective's executions by
    loop frame and iteration as well as by instance key."""
    with tf.Graph().as_default():
        def body(index, total_0, total_1):
            sums = []
            for member in range(2):
                with tf.device(f"/device:CPU:{member}"):
                    value = tf.cast(index, tf.float32) * (member + 1) + tf.zeros([2])
                    sums.append(collective_ops.all_reduce(value, 2, 0x7A9100, 1, "auto"))
            return index + 1, total_0 + sums[0], total_1 + sums[1]

        loop = tf.compat.v1.while_loop(lambda index, *_: index < 4, body,
                                       [tf.constant(0), tf.zeros([2]), tf.zeros([2])],
                                       parallel_iterations=1)
        config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
        with tf.compat.v1.Session(config=config) as session:
            _, total_0, total_1 = session.run(loop)
        # sum over iterations 0..3 of 3 * index
        if list(total_0) != [18.0, 18.0] or list(total_1) != [18.0, 18.0]:
            _broken(f"collectives in a while loop pairing per iteration: {total_0}, {total_1}")
