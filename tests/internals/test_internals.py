"""Each TensorFlow internal towerlib relies on, exercised for real.

When one of these fails after a TensorFlow upgrade, the message names the
internal and the towerlib module that depends on it: fix that one module.
"""

import os

import pytest
import tensorflow as tf

import towerlib
from towerlib.internals import checkpoint_files, collective_ops, error_texts, graph_edit


def _broken(internal, module, detail):
    pytest.fail(f"TensorFlow {tf.__version__} no longer provides {internal}, which "
                f"towerlib.internals.{module} relies on: {detail}", pytrace=False)


def test_replace_input_rewires_an_existing_op():
    with tf.Graph().as_default():
        first, second = tf.constant(1.0), tf.constant(2.0)
        doubled = tf.multiply(first, 2.0)
        try:
            graph_edit.replace_input(doubled.op, 0, second)
        except AttributeError as error:
            _broken("Operation._update_input", "graph_edit", error)
        with tf.compat.v1.Session() as session:
            assert session.run(doubled) == 4.0


def test_collective_ops_reduce_and_gather_across_devices():
    with tf.Graph().as_default():
        sums, gathers = [], []
        for index in range(2):
            with tf.device(f"/device:CPU:{index}"):
                value = tf.constant([[float(index + 1), 10.0]])  # [1, 2]
                try:
                    sums.append(collective_ops.all_reduce(value, 2, 0x7A9000, 1, "auto"))
                    gathers.append(collective_ops.all_gather(value, 2, 0x7A9000, 2, "auto"))
                except (AttributeError, TypeError) as error:
                    _broken("tensorflow.python.ops.collective_ops.all_reduce/all_gather "
                            "with these arguments", "collective_ops", error)
        for tensor in sums + gathers:
            if not collective_ops.is_collective_op(tensor.op):
                _broken(f"collective op type {tensor.op.type!r} with a static group_key",
                        "collective_ops", "COLLECTIVE_OP_TYPES needs the new type")
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            summed, gathered = session.run([sums, gathers])
    assert [s.tolist() for s in summed] == [[[3.0, 20.0]]] * 2
    # Rows come in rank order, the same on both devices.
    assert gathered[0].tolist() == gathered[1].tolist()
    assert sorted(gathered[0].tolist()) == [[1.0, 10.0], [2.0, 10.0]]


def test_collective_gather_of_bfloat16_crosses_as_float32():
    """CollectiveGather (V1) has no bfloat16 kernel: all_gather casts around it."""
    with tf.Graph().as_default():
        gathers = []
        for index in range(2):
            with tf.device(f"/device:CPU:{index}"):
                value = tf.constant([[index + 1.5, -3.0]], tf.bfloat16)
                gathers.append(collective_ops.all_gather(value, 2, 0x7A9001, 1, "auto"))
        assert all(tensor.dtype == tf.bfloat16 for tensor in gathers)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            gathered = session.run(gathers)
    assert sorted(gathered[0].astype("float32").tolist()) == [[1.5, -3.0], [2.5, -3.0]]


def test_missing_variable_message():
    with tf.Graph().as_default():
        with pytest.raises(ValueError) as raised:
            with tf.compat.v1.variable_scope("tower", reuse=True):
                tf.compat.v1.get_variable("never_created", [1])
    if not error_texts.is_missing_variable(raised.value):
        _broken("the 'does not exist' text of get_variable(reuse=True)", "error_texts",
                raised.value)


def test_foreign_graph_element_message():
    with tf.Graph().as_default():
        outer = tf.constant(1.0)
        with tf.Graph().as_default() as other, pytest.raises(ValueError) as raised:
            other.as_graph_element(outer)
    if not error_texts.is_foreign_graph_element(raised.value):
        _broken("the 'is not an element of this graph' text", "error_texts", raised.value)


def test_existing_variable_message():
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("made_once", [1])
        with pytest.raises(ValueError) as raised:
            tf.compat.v1.get_variable("made_once", [1])
    if not error_texts.is_existing_variable(raised.value):
        _broken("the 'already exists, disallowed' text of get_variable", "error_texts",
                raised.value)


@pytest.mark.parametrize("half", [tf.bfloat16, tf.float16])
def test_fused_batch_norm_dtype_message(half):
    """towerlib.precision.casting names the swap when TF 1 layers' batch norm meets a
    half compute dtype; it recognizes TensorFlow's refusal by these texts."""
    with tf.Graph().as_default():
        with pytest.raises(TypeError) as raised:
            tf.raw_ops.FusedBatchNormV3(
                x=tf.zeros([2, 2, 2, 3], half), scale=tf.ones([3], half),
                offset=tf.zeros([3], half), mean=tf.zeros([3]), variance=tf.ones([3]),
                is_training=True)
    if not error_texts.is_fused_batch_norm_dtype(raised.value):
        _broken("FusedBatchNormV3's dtype refusal texts", "error_texts", str(raised.value))


def test_run_deadline_message():
    with tf.Graph().as_default():
        queue = tf.queue.FIFOQueue(1, tf.float32)
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=200)
        with tf.compat.v1.Session(config=config) as session:
            with pytest.raises(tf.errors.DeadlineExceededError) as raised:
                session.run(queue.dequeue())
    if not error_texts.is_run_deadline(raised.value.message):
        _broken("the text of Session.run's deadline error", "error_texts",
                raised.value.message)
    assert error_texts.timeout_line(raised.value.message)


def test_collective_timeout_message():
    with tf.Graph().as_default():
        with tf.device("/device:CPU:0"):
            lonely = collective_ops.all_reduce(
                tf.constant([1.0]), 2, 0x7A9001, 1, "auto", timeout_seconds=0.5)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            with pytest.raises(tf.errors.DeadlineExceededError) as raised:
                session.run(lonely)
    if not error_texts.is_collective_timeout(raised.value.message):
        _broken("the text of a collective op's own timeout", "error_texts",
                raised.value.message)


def _save_into_a_blocked_prefix(tmp_path, sharded):
    """Saves where the final index path is a folder, so the last rename fails."""
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable("v", [3])
        saver = tf.compat.v1.train.Saver(sharded=sharded)
        os.makedirs(tmp_path / "m-1.index" / "blocked")
        with tf.compat.v1.Session() as session:
            session.run(variable.initializer)
            with pytest.raises(tf.errors.OpError):
                saver.save(session, str(tmp_path / "m"), global_step=1,
                           write_meta_graph=False)
    return sorted(os.listdir(tmp_path))


def test_tensor_bundle_temporary_name(tmp_path):
    names = _save_into_a_blocked_prefix(tmp_path, sharded=False)
    temporaries = [n for n in names if n not in ("m-1.index", "m-1.data-00000-of-00001")]
    if not temporaries or not all(map(checkpoint_files.is_tensorflow_leftover, temporaries)):
        _broken("the '<file>.tempstate<digits>' name of the tensor-bundle writer",
                "checkpoint_files", f"files left: {names}")


def test_sharded_saver_temporary_folder(tmp_path):
    names = _save_into_a_blocked_prefix(tmp_path, sharded=True)
    if "m-1_temp" not in names or not checkpoint_files.is_tensorflow_leftover("m-1_temp"):
        _broken("the '<prefix>_temp' folder of a sharded Saver", "checkpoint_files",
                f"files left: {names}")


def test_state_file_temporary_name(tmp_path, monkeypatch):
    from tensorflow.python.lib.io import file_io

    sources = []
    original = file_io.rename
    monkeypatch.setattr(file_io, "rename",
                        lambda source, *args, **kwargs: (sources.append(source),
                                                         original(source, *args, **kwargs)))
    tf.compat.v1.train.update_checkpoint_state(str(tmp_path), str(tmp_path / "m-1"))
    names = [os.path.basename(s) for s in sources]
    if not names or not all(map(checkpoint_files.is_tensorflow_leftover, names)):
        _broken("the '<name>.tmp<32 hex>' name of atomic_write_string_to_file",
                "checkpoint_files", f"renamed from: {names}")
    assert not checkpoint_files.is_tensorflow_leftover("model.ckpt-10.index")


def test_assert_message_format():
    with tf.Graph().as_default():
        check = tf.debugging.Assert(tf.constant(False), ["towerlib check 7:", tf.constant(3)])
        with tf.compat.v1.Session() as session:
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                session.run(check)
    if not error_texts.names_assert(raised.value, "towerlib check 7:"):
        _broken("the '[item] [item]' format of a failed tf.debugging.Assert's data",
                "error_texts", raised.value.message)
    assert not error_texts.names_assert(raised.value, "towerlib check 8:")


def test_deprecation_warnings_can_be_silenced_for_one_call(caplog):
    """towerlib.internals.deprecations: TensorFlow's silence() still exists and works."""
    from tensorflow.python.util import deprecation  # pylint: disable=import-outside-toplevel

    from towerlib.internals import deprecations  # pylint: disable=import-outside-toplevel

    old_api = deprecation.deprecated(None, "Use something else.")(lambda: 1)
    try:
        with deprecations.silenced(), caplog.at_level("WARNING"):
            old_api()
    except AttributeError as error:
        _broken("tensorflow.python.util.deprecation.silence", "deprecations", error)
    assert "deprecated" not in caplog.text
    with caplog.at_level("WARNING"):
        old_api()  # the first unsilenced call warns: the test above could fail
    assert "deprecated" in caplog.text


def test_a_taken_port_is_recognized_and_named():
    """towerlib.internals.error_texts.is_port_taken: the text of a server that cannot bind."""
    import socket  # pylint: disable=import-outside-toplevel

    from towerlib import cluster as cluster_lib  # pylint: disable=import-outside-toplevel

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        port = holder.getsockname()[1]
        cluster = cluster_lib.cluster_from_flags(
            worker_hosts=f"127.0.0.1:{port}", job_name="worker", task_index=0)
        with pytest.raises(cluster_lib.AddressError,
                           match=rf"cannot listen on 127.0.0.1:{port}"):
            cluster_lib.start_server(cluster, 1)
    finally:
        holder.close()


def test_index_shuffle_takes_one_seed_per_index_and_keeps_its_permutations():
    from towerlib.internals import index_shuffle
    seeds = [[5, 0, 7]] * 10
    got = index_shuffle.shuffled_indices(tf.range(10, dtype=tf.int64), seeds, 9).numpy()
    # A resumed run must read the examples the first run would have: a release that
    # changes these permutations changes every saved run's data order.
    assert got.tolist() == [8, 2, 0, 4, 1, 9, 3, 5, 6, 7], (
        "tf.raw_ops.RandomIndexShuffle's permutation changed: towerlib.global_batch_input's "
        "runs would resume on other examples (towerlib/internals/index_shuffle.py).")
    mixed = index_shuffle.shuffled_indices([2, 3], [[5, 0, 7], [5, 1, 7]], 9).numpy()
    assert mixed.tolist() == [0, 3]


def test_tfrecord_dataset_v2_reads_one_record_at_a_byte_offset_and_checks_its_crc(tmp_path):
    from towerlib.internals import record_reads
    path = str(tmp_path / "records.tfrecord")
    payloads = [bytes([k]) * (100 + k) for k in range(4)]
    with tf.io.TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)
    offsets = [sum(len(p) + 16 for p in payloads[:k]) for k in range(4)]

    def read(file, k):
        with tf.Graph().as_default():
            # Inside a tf.data function, as towerlib reads it (its graph serialization
            # drops byte_offsets, which only a top-level dataset needs).
            dataset = tf.data.Dataset.from_tensors(tf.constant(k, tf.int64)).map(
                lambda i: record_reads.tfrecord_at(
                    tf.constant(file), tf.gather(offsets, i),
                    tf.constant(len(payloads[k]), tf.int64)).get_single_element())
            with tf.compat.v1.Session() as session:
                return session.run(tf.compat.v1.data.make_one_shot_iterator(
                    dataset).get_next())

    try:
        got = [read(path, k) for k in (2, 0, 3)]
    except (AttributeError, TypeError, tf.errors.OpError) as error:
        _broken("tf.raw_ops.TFRecordDatasetV2(byte_offsets=...) with "
                "tf.data.experimental.from_variant", "record_reads", error)
    assert got == [payloads[2], payloads[0], payloads[3]]
    data = bytearray(open(path, "rb").read())
    data[offsets[1] + 12 + 5] ^= 1  # one payload byte of record 1
    bad = str(tmp_path / "bad.tfrecord")
    open(bad, "wb").write(bytes(data))
    with pytest.raises(tf.errors.DataLossError, match="corrupted record"):
        read(bad, 1)


def test_tf1_optimizers_keep_their_rate_and_momentum_where_towerlib_reads_them():
    from towerlib.internals import optimizer_settings

    train = tf.compat.v1.train
    cases = [(train.GradientDescentOptimizer(0.25), {"learning_rate": 0.25}),
             (train.MomentumOptimizer(0.25, 0.5), {"learning_rate": 0.25, "momentum": 0.5}),
             (train.AdamOptimizer(0.25), {"learning_rate": 0.25}),
             (train.RMSPropOptimizer(0.25, momentum=0.5), {"learning_rate": 0.25,
                                                           "momentum": 0.5}),
             (train.AdagradOptimizer(0.25), {"learning_rate": 0.25})]
    for optimizer, want in cases:
        got = optimizer_settings.settings(optimizer)
        if got != want:
            _broken(f"{type(optimizer).__name__}'s private attributes holding its "
                    "constructor's learning_rate and momentum", "optimizer_settings",
                    f"read {got}, want {want}")
