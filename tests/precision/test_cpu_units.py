"""One line when bfloat16 towers run on a CPU without bfloat16 units, and only then."""

import logging

import pytest

import towerlib
from towerlib.precision import cpu_units

AVX2_ONLY = frozenset({"fpu", "sse2", "avx", "avx2", "fma", "f16c"})
CPU_TOWERS = ["/device:CPU:0", "/device:CPU:1"]


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "towerlib" and "bfloat16 units" in r.getMessage()]


def test_bfloat16_on_cpu_towers_without_the_flags_is_one_line_naming_the_fix(
        caplog, monkeypatch):
    monkeypatch.setattr(cpu_units, "cpu_flags", lambda: AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="towerlib"):
        message = cpu_units.warn_if_bfloat16_is_emulated(towerlib.BFloat16(), CPU_TOWERS)
    assert warnings_of(caplog) == [message]
    assert "2 CPU tower(s)" in message and cpu_units.MEASURED_SLOWDOWN in message
    assert "Fix: precision=towerlib.Float32(), or a machine whose CPU has AVX512_BF16 " \
        "or AMX" in message


@pytest.mark.parametrize("flags", [AVX2_ONLY | {"avx512_bf16"}, AVX2_ONLY | {"amx_bf16"},
                                   None])
def test_nothing_is_said_with_bfloat16_units_or_unknown_flags(flags, caplog, monkeypatch):
    monkeypatch.setattr(cpu_units, "cpu_flags", lambda: flags)
    with caplog.at_level(logging.WARNING, logger="towerlib"):
        assert cpu_units.warn_if_bfloat16_is_emulated("bfloat16", CPU_TOWERS) is None
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("precision, devices", [
    (towerlib.Float32(), CPU_TOWERS), (towerlib.Float16(), CPU_TOWERS),
    (towerlib.BFloat16(), ["/device:GPU:0", "/job:worker/task:1/device:GPU:1"])])
def test_other_precisions_and_gpu_towers_say_nothing(precision, devices, monkeypatch):
    monkeypatch.setattr(cpu_units, "cpu_flags", lambda: AVX2_ONLY)
    assert cpu_units.warn_if_bfloat16_is_emulated(precision, devices) is None


def test_a_cpu_tower_among_gpu_towers_is_judged(monkeypatch):
    monkeypatch.setattr(cpu_units, "cpu_flags", lambda: AVX2_ONLY)
    message = cpu_units.warn_if_bfloat16_is_emulated(
        "bfloat16", ["/device:GPU:0", "/job:worker/replica:0/task:0/device:CPU:0"])
    assert message and "1 CPU tower(s)" in message


def test_the_flags_are_read_from_the_first_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\n"
                       "flags\t\t: fpu avx2 avx512_bf16\nbogus\t: x\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_units.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_units.cpu_flags(str(tmp_path / "none")) is None
    (tmp_path / "empty").write_text("processor\t: 0\n")
    assert cpu_units.cpu_flags(str(tmp_path / "empty")) is None


@pytest.mark.parametrize("precision, flags, lines", [
    ("bfloat16", frozenset({"avx2", "fma"}), 1), ("float32", frozenset({"avx2"}), 0),
    ("bfloat16", frozenset({"avx2", "avx512_bf16"}), 0)])
def test_the_build_says_it_once_for_bfloat16_on_a_cpu_without_its_units(
        monkeypatch, caplog, precision, flags, lines):
    import tensorflow as tf

    import towerlib
    from tests import helpers
    from towerlib.precision import cpu_units

    monkeypatch.setattr(cpu_units, "cpu_flags", lambda *args: flags)
    with tf.Graph().as_default(), caplog.at_level("WARNING", logger="towerlib"):
        images, labels = helpers.image_batch(4)
        towerlib.build_train_graph(
            helpers.conv_dense_model, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2,
            device_type="cpu", precision=precision)
    said = [r for r in caplog.records if "bfloat16 units" in r.getMessage()]
    assert len(said) == lines, [r.getMessage() for r in caplog.records]
