"""The run's facts for BENCHMARKS.md: the machine, the time, the results indexed.

bench/report.py renders these; bench/run.py records the machine and the load
around a run.
"""

import datetime
import os
import platform

from bench import measure

# --- the machine ---------------------------------------------------------------------------


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib():
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2.0 ** 20
    except OSError:
        pass
    return None


def machine_description():
    """{'nproc', 'cpu_model', 'ram_gib', 'python', 'platform'} of this machine."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"nproc": usable, "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(),
            "ram_gib": _ram_gib(), "python": platform.python_version(),
            "platform": platform.platform()}


def load_average():
    """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
    return list(os.getloadavg())


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _identity(config):
    return (config.kind, config.bn_mode, config.input_source)


# --- the run's results, indexed ------------------------------------------------------------


class RunResults:
    """All ConfigResults of a run, looked up by (model, towers, identity)."""

    def __init__(self, results, global_batch):
        self.global_batch = global_batch
        self.by_identity = {}
        for result in results:
            config = result.config
            self.by_identity[(config.model, config.num_towers, _identity(config))] = result
        self.models = list(dict.fromkeys(r.config.model for r in results))
        self.tower_counts = sorted({r.config.num_towers for r in results})

    def get(self, model, towers, identity):
        return self.by_identity.get((model, towers, identity))

    def rows(self, model):
        """The distinct configurations of `model`, in plan order."""
        seen = {}
        for (m, _, identity), result in self.by_identity.items():
            if m == model and identity not in seen:
                seen[identity] = result.config.label
        return list(seen.items())

    def ratio(self, model, towers, numerator, denominator, quantity, clock="wall"):
        """Summary of the per-repetition ratio, or a string saying why there is none.

        quantity 'step_time' divides seconds per step, 'throughput' images/sec;
        clock 'wall' uses wall-clock time, 'cpu' the processes' CPU time.
        """
        top = self.get(model, towers, numerator)
        bottom = self.get(model, towers, denominator)
        for side in (top, bottom):
            if side is None:
                return "not measured"
            if not side.ok:
                return "not available" if side.status == "unavailable" else "failed"
        top_times, bottom_times = ((top.step_seconds, bottom.step_seconds) if clock == "wall"
                                   else (top.step_cpu_seconds, bottom.step_cpu_seconds))
        if quantity == "step_time":
            return measure.ratio_summary(top_times, bottom_times)
        return measure.ratio_summary(bottom_times, top_times)
