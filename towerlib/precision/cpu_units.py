"""Whether this machine's CPU computes bfloat16 in hardware, and one line when it does not.

    cpu_units.warn_if_bfloat16_is_emulated(options.precision, devices)  # in the build

x86 CPUs without AVX512_BF16 or AMX-BF16 have no bfloat16 arithmetic: TensorFlow
converts every bfloat16 operand to float32 and back, and a bfloat16 step is slower
than a float32 one (docs/precision.md, "When bfloat16 pays"). The flags come from
/proc/cpuinfo, so only Linux is judged; elsewhere nothing is said. Only CPU towers are
judged: a GPU tower's bfloat16 runs on the GPU.
"""

import logging
from typing import Callable, FrozenSet, Optional, Sequence

import tensorflow as tf

__all__ = ["BFLOAT16_FLAGS", "cpu_flags", "warn_if_bfloat16_is_emulated"]

CPUINFO = "/proc/cpuinfo"
BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# bench/bench_keras.py, 4 CPU towers, ResNet-20 (docs/precision.md): the bfloat16 /
# float32 step time on an AMD EPYC with AVX2 and neither flag, towerlib.layers 11.8x and
# Keras 10.3x in one interleaved run (7.5x for Keras in an earlier one).
MEASURED_SLOWDOWN = "8-12x"

logger = logging.getLogger("towerlib")


def cpu_flags(path: str = CPUINFO) -> Optional[FrozenSet[str]]:
    """The CPU's feature flags (the first 'flags' line of /proc/cpuinfo), or None where
    there is no such file (not Linux) or it has no flags line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def warn_if_bfloat16_is_emulated(
        precision, devices: Sequence[str],
        read_flags: Optional[Callable[[], Optional[FrozenSet[str]]]] = None
) -> Optional[str]:
    """Logs one warning, and returns it, when `precision` is bfloat16, a tower is a CPU
    device and this machine's CPU has neither BFLOAT16_FLAGS; else returns None.

    Args:
      precision: a towerlib.precision.choice.Precision (its `name` is read).
      devices: the towers' device strings.
      read_flags: returns the CPU's flags or None (unknown: nothing is said);
        default cpu_flags.
    """
    if getattr(precision, "name", precision) != "bfloat16":
        return None
    cpu_towers = [d for d in devices
                  if (tf.DeviceSpec.from_string(d).device_type or "").upper() == "CPU"]
    if not cpu_towers:
        return None
    flags = (read_flags or cpu_flags)()
    if flags is None or flags & BFLOAT16_FLAGS:
        return None
    message = (
        f"precision=BFloat16() on {len(cpu_towers)} CPU tower(s), and this CPU has no "
        f"bfloat16 units (neither {' nor '.join(sorted(BFLOAT16_FLAGS))} in "
        f"{CPUINFO}): each bfloat16 operation is converted through float32, and a step "
        f"measured {MEASURED_SLOWDOWN} slower than float32 on such a CPU. Fix: "
        "precision=towerlib.Float32(), or a machine whose CPU has AVX512_BF16 or AMX "
        "(or GPU towers).")
    logger.warning(message)
    return message
