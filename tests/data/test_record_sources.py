"""Record sources read by index (towerlib.TFRecords, towerlib.FixedLengthRecords): the
same global batches as the arrays they hold, shards checked when indexed, the source's
identity in every checkpoint, and the order as the docs write it with public ops."""

import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.data.record_files import decode, write_shards
from towerlib.run import global_batches

N = 10
FEATURES = np.arange(N * 6, dtype=np.float32).reshape(N, 6)
LABELS = np.arange(N, dtype=np.int32)


def _read(source, steps, batch=4, seed=3, workers=None, augment=None, restore=None,
          save=None, **options):
    """Each step's (x, labels) this worker reads."""
    with tf.Graph().as_default():
        batch_tensors = towerlib.global_batch_input(source, batch, seed=seed, workers=workers,
                                                    augment=augment, **options)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            if restore:
                saver.restore(session, restore)
            session.run(tf.compat.v1.tables_initializer())
            read = [session.run(batch_tensors) for _ in range(steps)]
            if save:
                saver.save(session, save)
    return read


def _shards(tmp_path, num_shards=3, n=N):
    write_shards(tmp_path / "data", FEATURES[:n], LABELS[:n], num_shards)
    return towerlib.TFRecords(str(tmp_path / "data" / "train-*.tfrecord"), decode=decode)


def test_tfrecords_read_the_global_batches_the_arrays_do_on_any_worker_count(tmp_path):
    source = _shards(tmp_path)
    expected = [labels.tolist() for _, labels in _read((FEATURES, LABELS), 6)]
    for workers in (1, 3):
        slices = [_read(source, 6, workers=towerlib.WorkerGroup(workers, w))
                  for w in range(workers)]
        got = [sum((s[step][1].tolist() for s in slices), []) for step in range(6)]
        assert got == expected
    for x, label in zip(*_read(source, 1)[0]):
        assert x.tolist() == FEATURES[label].tolist()


def test_the_index_is_kept_beside_the_shards_and_rebuilt_when_one_changes(tmp_path):
    source = _shards(tmp_path)
    assert source.num_examples == N
    index = [s.index_path for s in source.shards]
    assert all(os.path.isfile(p) and p.endswith(".towerlib-index") for p in index)
    before = source.fingerprint
    write_shards(tmp_path / "data", FEATURES[:9], LABELS[:9], 3)  # shards rewritten
    again = towerlib.TFRecords(source.files, decode=decode)
    assert again.num_examples == 9 and again.fingerprint != before
    elsewhere = towerlib.TFRecords(source.files, decode=decode, index_dir=tmp_path / "idx")
    assert elsewhere.num_examples == 9 and len(os.listdir(tmp_path / "idx")) == 3


def test_a_shard_truncated_mid_record_is_refused_in_one_line(tmp_path):
    source = _shards(tmp_path)
    shard = source.shards[1].path
    second = int(source.shards[1].offsets[1])
    with open(shard, "r+b") as file:
        file.truncate(second + 20)  # the second record's header and a few bytes
    with pytest.raises(towerlib.DataError) as raised:
        towerlib.TFRecords(source.files, decode=decode).num_examples
    said = str(raised.value)
    assert "\n" not in said and shard in said and f"truncated at offset {second}" in said
    assert "Fix:" in said


def test_a_corrupt_length_header_is_refused_naming_the_offset(tmp_path):
    source = _shards(tmp_path)
    shard = source.shards[0].path
    with open(shard, "r+b") as file:
        file.seek(int(source.shards[0].offsets[2]) + 1)
        file.write(b"\x7f")
    stat = os.stat(shard)  # a later edit (this one may fall in the same mtime tick)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(towerlib.DataError, match=f"{shard} is corrupt at offset "
                       f"{int(source.shards[0].offsets[2])}"):
        towerlib.TFRecords(source.files, decode=decode).num_examples


def test_a_file_towerlib_did_not_write_is_never_taken_for_an_index(tmp_path):
    write_shards(tmp_path / "data", FEATURES, LABELS, 1)
    shard = str(tmp_path / "data" / "train-00000.tfrecord")
    with open(shard + ".towerlib-index", "wb") as file:
        file.write(b"someone else's notes")
    with pytest.raises(towerlib.DataError, match="not an index towerlib wrote"):
        towerlib.TFRecords([shard]).num_examples
    assert open(shard + ".towerlib-index", "rb").read() == b"someone else's notes"


def test_a_source_changed_between_runs_is_refused_in_one_line(tmp_path):
    prefix = str(tmp_path / "model.ckpt")
    _read(_shards(tmp_path / "a"), 3, save=prefix)
    changed = {"other n": _shards(tmp_path / "b", n=9),
               "same n, other data": (FEATURES + 1, LABELS)}
    for what, source in changed.items():
        with tf.Graph().as_default():
            towerlib.global_batch_input(source, 4, seed=3)
            with pytest.raises(towerlib.CheckpointError) as raised:
                global_batches.check_checkpoint(tf.compat.v1.get_default_graph(), prefix)
        said = str(raised.value)
        assert "\n" not in said and "allow_new_source=True" in said, what
        if what == "other n":
            assert f"{N} examples and this run's 9" in said


def test_another_source_when_allowed_goes_on_from_the_position(tmp_path):
    prefix = str(tmp_path / "model.ckpt")
    _read(_shards(tmp_path / "a"), 3, save=prefix)  # 12 positions read
    smaller = _shards(tmp_path / "b", n=8)
    with tf.Graph().as_default():
        towerlib.global_batch_input(smaller, 4, seed=3, allow_new_source=True)
        said = global_batches.check_checkpoint(tf.compat.v1.get_default_graph(), prefix)
    assert "another computation" in said
    got = _read(smaller, 2, restore=prefix, allow_new_source=True)
    expected = [towerlib.global_batch_examples(step, seed=3, num_examples=8,
                                               global_batch_size=4) for step in (3, 4)]
    assert [labels.tolist() for _, labels in got] == [e.tolist() for e in expected]


def test_the_docs_formula_with_public_ops_gives_the_inputs_order():
    """docs/distributed.md: position p of the stream, with e = p // n, is example
    tf.raw_ops.RandomIndexShuffle(index=p % n, seed=[seed, e, 0x67626174],
    max_index=n - 1, rounds=4), augmented with the seed [seed, e * n + example]."""
    seed, n, batch, steps = 7, N, 4, 6
    positions = np.arange(steps * batch)
    epochs = positions // n
    examples = [int(tf.raw_ops.RandomIndexShuffle(
        index=tf.constant(p % n, tf.int64), seed=tf.constant([seed, e, 0x67626174], tf.int64),
        max_index=tf.constant(n - 1, tf.int64), rounds=4)) for p, e in zip(positions, epochs)]

    def augment(example, key):  # the augmentation seed, read back
        x, label = example
        return tf.cast(key, tf.float32)[None, :] * tf.ones([3, 1]), label

    read = _read((FEATURES, LABELS), steps, batch=batch, seed=seed, augment=augment)
    assert sum((labels.tolist() for _, labels in read), []) == examples
    keys = np.concatenate([x[:, 0, :] for x, _ in read]).astype(np.int64).tolist()
    assert keys == [[seed, e * n + x] for e, x in zip(epochs, examples)]
    public = [towerlib.global_batch_examples(s, seed=seed, num_examples=n,
                                             global_batch_size=batch).tolist()
              for s in range(steps)]
    assert sum(public, []) == examples
    worker = towerlib.global_batch_examples(2, seed=seed, num_examples=n,
                                            global_batch_size=batch, num_workers=3,
                                            worker_index=1)
    assert worker.tolist() == examples[8 + 2:8 + 3]  # slices of 2, 1, 1


def test_fixed_length_records_stream_the_global_batches_the_arrays_do(tmp_path):
    rows = np.concatenate([LABELS[:, None], FEATURES.astype(np.uint8)], 1).astype(np.uint8)
    rows[:5].tofile(str(tmp_path / "part_0.bin"))
    rows[5:].tofile(str(tmp_path / "part_1.bin"))

    def decode_row(record):
        values = tf.io.decode_raw(record, tf.uint8)
        return tf.cast(values[1:], tf.float32), tf.cast(values[0], tf.int32)

    expected = [labels.tolist() for _, labels in _read((FEATURES, LABELS), 5)]
    for in_memory in (False, True):
        source = towerlib.FixedLengthRecords(str(tmp_path / "part_*.bin"), 7, decode_row,
                                             in_memory=in_memory)
        got = _read(source, 5)
        assert [labels.tolist() for _, labels in got] == expected
        assert got[0][0].tolist() == rows[got[0][1], 1:].astype(np.float32).tolist()
