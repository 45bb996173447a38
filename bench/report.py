"""BENCHMARKS.md: the machine, the command, the tables, the targets' verdicts.

Every number in the report is computed here from the raw results of one run
(`bench.coordinator.ConfigResult`); nothing is typed in. The targets
themselves (which ratio, which bound, where) are data in bench/targets.py;
this module only renders: cells of a target row say whether the target was
met, so a missed target is visible in the table itself.
"""

import datetime
import math
import os
import platform
from typing import Dict, List, Optional

from bench import configs as configs_lib
from bench import measure
from bench.targets import (HANDWRITTEN, MIRRORED, SINGLE, TARGETS, TOWERLIB_CIFAR,
                           TOWERLIB_FIRST)

CHECK = "met"
CROSS = "**MISSED**"


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


# --- formatting ----------------------------------------------------------------------------


def _fmt(value, digits=2):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _count(number, noun):
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _table(header: List[str], rows: List[List[str]], text_columns=1) -> List[str]:
    """A Markdown table; the first `text_columns` columns left-aligned, numbers right."""
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if i < text_columns else "---:"
                               for i in range(len(header))) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _status_cell(result):
    if result is None:
        return "not measured"
    if result.status == "unavailable":
        return f"not available ({result.reason})" if len(result.reason) < 60 else "not available"
    return "failed"


def _throughput_cell(result, global_batch):
    if result is None or not result.ok:
        return _status_cell(result)
    summary = measure.summarize(measure.images_per_second(result.step_seconds, global_batch))
    if summary is None:
        return "failed"
    return f"{summary.median:.1f} ±{100 * summary.spread / 2:.0f}%"


def _ratio_cell(summary, target=None):
    if not isinstance(summary, measure.Summary):
        return summary
    text = f"{summary.median:.3f} ({summary.low:.2f}-{summary.high:.2f})"
    if target is not None:
        text += " " + (CHECK if target.met(summary.median) else CROSS)
    return text


# --- sections ------------------------------------------------------------------------------


def _header(meta):
    machine = meta["machine"]
    devices = ("GPUs" if meta["device_type"] == "gpu"
               else f"{max(meta['tower_counts'])} virtual CPU devices at most, sharing the "
                    "machine's cores")
    lines = [
        "# Benchmarks: towerlib side by side",
        "",
        "Generated by `bench/run.py` from one run; every number below was computed from "
        "that run's measurements, whose per-step times are listed at the end.",
        "",
    ]
    if meta.get("rendered_from"):
        lines += [f"Rendered again from that run's raw results ({meta['rendered_from']}) "
                  "to add the analysis at the end; the measurements are unchanged.", ""]
    if meta.get("smoke"):
        lines += ["**Smoke run**: a couple of steps per configuration, to check that the "
                  "benchmark runs. These numbers mean nothing.", ""]
    lines += _table(["", ""], text_columns=2, rows=[
        ["command", f"`{meta['command']}`"],
        ["date", meta["date"]],
        ["machine", f"{machine['nproc']} usable cores (nproc; {machine['cpu_count']} "
                    f"in the machine), {machine['cpu_model']}, "
                    f"{_fmt(machine['ram_gib'], 1)} GiB RAM"],
        ["software", f"TensorFlow {meta['tf_version']}, Python {machine['python']}, "
                     f"{machine['platform']}"],
        ["devices", devices],
        ["load average (1, 5, 15 min)",
         f"before {', '.join(_fmt(x) for x in meta['load_before'])}; "
         f"after {', '.join(_fmt(x) for x in meta['load_after'])}"],
        ["run", f"global batch {meta['global_batch']}, {meta['repeats']} repetitions x "
                f"{meta['steps']} timed steps per configuration, "
                f"{_count(meta['warmup_steps'], 'warm-up step')} after building and "
                f"{meta['segment_warmup_steps']} before each timed segment; workers started "
                f"{meta.get('start_parallelism', 1)} at a time; "
                f"{_fmt(meta['wall_seconds'] / 60, 1)} min in all"],
    ])
    lines += [
        "",
        "The machine was shared with other programs during the run (see the load average). "
        "Configurations of one model and tower count were timed in alternation: each "
        "repetition times every configuration once, in "
        + ("a new random order" if meta.get("order") == "random"
           else "a rotating order (the runs before random orders were introduced)")
        + ", so that load from elsewhere falls on all of them alike; ratios are the "
        "median of per-repetition ratios (range in parentheses), throughputs the median "
        "over repetitions (± half the full range).",
        "",
    ]
    return lines


def _throughput_section(run, model, meta):
    lines = [f"### Images/sec, {model}", ""]
    header = ["configuration"] + [f"{t} tower{'s' if t > 1 else ''}" for t in run.tower_counts]
    rows = []
    for identity, label in run.rows(model):
        rows.append([label] + [_throughput_cell(run.get(model, t, identity), run.global_batch)
                               for t in run.tower_counts])
    lines += _table(header, rows) + [""]
    lines += [f"CPU seconds per step (user + system, all threads of the configuration's "
              f"process; median over repetitions), {model}:", ""]
    rows = []
    for identity, label in run.rows(model):
        cells = []
        for towers in run.tower_counts:
            result = run.get(model, towers, identity)
            summary = (measure.summarize(result.step_cpu_seconds)
                       if result is not None and result.ok else None)
            cells.append(_fmt(summary.median, 3) if summary else _status_cell(result)
                         if result is None or not result.ok else "n/a")
        rows.append([label] + cells)
    return lines + _table(header, rows) + [""]


def _ratio_rows(run, model):
    """(label, {towers: cell}) for the ratio table: targets first, then context."""
    rows = []
    for target in TARGETS:
        if target.tower_counts is not None and any(
                other.name == target.name and other.tower_counts is None for other in TARGETS):
            continue  # shown in the every-count row, checked against both bounds there
        cells = {}
        for towers in run.tower_counts:
            summary = run.ratio(model, towers, target.numerator, target.denominator,
                                target.quantity)
            applicable = [t for t in TARGETS if t.name == target.name and t.applies_to(towers)]
            cell = _ratio_cell(summary)
            if isinstance(summary, measure.Summary) and applicable:
                verdicts = [_verdict(t, summary) for t in applicable]
                missed = [v for v in verdicts if v.startswith(CROSS)]
                cell += " " + (missed[0] if missed else verdicts[0])
            cells[towers] = cell
        bounds = "; ".join(t.bound_text for t in TARGETS if t.name == target.name)
        rows.append((f"{target.name} (target {bounds})", cells))
    for mode in ("all_towers", "sync"):
        identity = (configs_lib.TOWERLIB, mode, configs_lib.SYNTHETIC_INPUT)
        rows.append((f"towerlib {mode} / hand-written towers, step time (no target)",
                     {t: _ratio_cell(run.ratio(model, t, identity, HANDWRITTEN, "step_time"))
                      for t in run.tower_counts}))
    rows.append(("MirroredStrategy / one device on the whole batch, step time (no target)",
                 {t: _ratio_cell(run.ratio(model, t, MIRRORED, SINGLE, "step_time"))
                  for t in run.tower_counts}))
    for label, numerator, denominator in (
            ("towerlib first_tower / hand-written towers", TOWERLIB_FIRST, HANDWRITTEN),
            ("towerlib first_tower / MirroredStrategy", TOWERLIB_FIRST, MIRRORED),
            ("towerlib first_tower / one device on the whole batch", TOWERLIB_FIRST,
             SINGLE)):
        rows.append((f"{label}, CPU time per step (no target; less sensitive to load)",
                     {t: _ratio_cell(run.ratio(model, t, numerator, denominator,
                                               "step_time", clock="cpu"))
                      for t in run.tower_counts}))
    return rows


def _ratio_section(run, model):
    lines = [f"### Ratios, {model}", ""]
    header = ["ratio"] + [f"{t} tower{'s' if t > 1 else ''}" for t in run.tower_counts]
    rows = [[label] + [cells[t] for t in run.tower_counts]
            for label, cells in _ratio_rows(run, model)]
    return lines + _table(header, rows) + [""]


def _scaling_section(run, model, device_type):
    """Throughput at N devices against N times the throughput at 1 (across groups)."""
    lines = [f"### Scaling from 1 to N devices, {model}", ""]
    if device_type == "gpu":
        lines += ["Efficiency = images/sec at N GPUs / (N x images/sec at 1 GPU), "
                  "towerlib first_tower.", ""]
    else:
        lines += ["On virtual CPU devices every tower shares the same cores, so the ideal is "
                  "flat throughput (efficiency 1/N); the ratio to one tower is what matters "
                  "here. On a GPU machine the same command measures real scaling.", ""]
    base = run.get(model, 1, TOWERLIB_FIRST)
    base_summary = (measure.summarize(measure.images_per_second(
        base.step_seconds, run.global_batch)) if base is not None and base.ok else None)
    rows = []
    for identity, label in run.rows(model):
        if identity[0] == configs_lib.SINGLE_DEVICE or identity == TOWERLIB_CIFAR:
            continue
        cells = []
        for towers in run.tower_counts:
            result = run.get(model, towers, identity)
            if base_summary is None or result is None or not result.ok:
                cells.append("n/a")
                continue
            summary = measure.summarize(measure.images_per_second(
                result.step_seconds, run.global_batch))
            relative = summary.median / base_summary.median if summary else None
            efficiency = relative / towers if relative is not None else None
            cells.append(f"x{_fmt(relative)} (eff. {_fmt(efficiency)})")
        rows.append([label] + cells)
    header = ["configuration, vs towerlib first_tower at 1 tower"] + [
        f"{t} tower{'s' if t > 1 else ''}" for t in run.tower_counts]
    return lines + _table(header, rows) + [""]


def _construction_section(run, model):
    lines = [f"### Graph construction, {model}", "",
             "Seconds from an empty graph to the train op (input, towers, gradients, "
             "update): the fastest of the builds (each in a fresh graph; building is "
             "deterministic single-threaded work, so other programs' load and one-time "
             "lazy imports only add to it). Then the first step (placement, graph "
             "optimization; for MirroredStrategy: its setup, variables and tracing).", ""]
    header = ["tower count", "towerlib build s", "s per tower", "hand-written build s",
              "towerlib first step s", "MirroredStrategy setup + first step s"]
    rows = []
    xs, ys = [], []
    for towers in run.tower_counts:
        towerlib = run.get(model, towers, TOWERLIB_FIRST)
        hand = run.get(model, towers, HANDWRITTEN)
        mirrored = run.get(model, towers, MIRRORED)
        build = (min(towerlib.build_seconds)
                 if towerlib is not None and towerlib.build_seconds else None)
        hand_build = min(hand.build_seconds) if hand is not None and hand.build_seconds else None
        if build is not None:
            xs.append(towers)
            ys.append(build)
        mirrored_first = None
        if mirrored is not None and mirrored.first_step_seconds is not None:
            mirrored_first = mirrored.first_step_seconds + sum(mirrored.build_seconds)
        rows.append([str(towers), _fmt(build, 3),
                     _fmt(build / towers if build is not None else None, 3),
                     _fmt(hand_build, 3),
                     _fmt(towerlib.first_step_seconds if towerlib else None, 2),
                     _fmt(mirrored_first, 2)])
    lines += _table(header, rows)
    fit = measure.linear_fit(xs, ys)
    if fit is not None:
        slope, intercept, r2 = fit
        lines += ["", f"Least-squares fit of towerlib's build time: {slope:.3f} s per tower "
                      f"+ {intercept:.3f} s, r² = {r2:.3f} "
                      f"({'linear' if r2 >= 0.95 else 'not clearly linear'} in the tower count)."]
    return lines + [""]


def _memory_section(run, model):
    lines = [f"### Peak memory, {model}", "",
             "Peak resident set size (ru_maxrss) of each configuration's own process, in "
             "MB; in parentheses the growth over the process before the model was built "
             "(TensorFlow itself).", ""]
    header = ["configuration"] + [f"{t} tower{'s' if t > 1 else ''}" for t in run.tower_counts]
    rows = []
    for identity, label in run.rows(model):
        cells = []
        for towers in run.tower_counts:
            result = run.get(model, towers, identity)
            if result is None or not result.ok or result.peak_rss_mb is None:
                cells.append(_status_cell(result) if result is None or not result.ok
                             else "n/a")
                continue
            cell = f"{result.peak_rss_mb:.0f} (+{result.peak_rss_mb - result.baseline_rss_mb:.0f})"
            if result.gpu_peak_mb:
                cell += f"; GPU peak {max(result.gpu_peak_mb):.0f}"
            cells.append(cell)
        rows.append([label] + cells)
    return lines + _table(header, rows) + [""]


def _weights_section(run, model):
    """Evidence that every configuration trained the same model from the same weights."""
    lines = [f"### Same weights, {model}", ""]
    initial = {r.initial_checksum for r in run.by_identity.values()
               if r.config.model == model and r.ok and r.initial_checksum is not None}
    if initial:
        spread = (max(initial) - min(initial)) / max(abs(max(initial)), 1e-12)
        lines.append(f"Initial weights: sum |w| = {max(initial):.4f} in every configuration "
                     f"(relative difference {spread:.1e}).")
    # Same data, same steps, same update: these end with the same trainable weights
    # (batch norm over each tower's own shard); one device and sync normalize over
    # the whole batch and agree with each other instead.
    families = {
        "per-shard batch norm (towerlib first_tower / all_towers, hand-written, "
        "MirroredStrategy)": [TOWERLIB_FIRST, (configs_lib.TOWERLIB, "all_towers",
                                               configs_lib.SYNTHETIC_INPUT),
                              HANDWRITTEN, MIRRORED],
        "whole-batch statistics (towerlib sync, one device)": [
            (configs_lib.TOWERLIB, "sync", configs_lib.SYNTHETIC_INPUT), SINGLE],
    }
    traces = [r.trace_count for r in run.by_identity.values()
              if r.config.model == model and r.ok and r.trace_count]
    if traces:
        retraced = [t for t in traces if len(t) > 1 and t[-1] != t[0]]
        lines.append(f"MirroredStrategy's tf.function was traced {traces[0][0]} times "
                     "before timing (its first call traces twice because it creates the "
                     "optimizer's slot variables) and "
                     + ("never again." if not retraced else
                        f"AGAIN during timing in {len(retraced)} configuration(s)."))
    for description, identities in families.items():
        worst = 0.0
        compared = 0
        for towers in run.tower_counts:
            values = [run.get(model, towers, i) for i in identities]
            values = [r.final_checksum for r in values
                      if r is not None and r.ok and r.final_checksum is not None]
            if len(values) > 1:
                compared += 1
                worst = max(worst, (max(values) - min(values)) / abs(max(values)))
        if compared:
            lines.append(f"Trainable weights after the last step, {description}: largest "
                         f"relative difference of sum |w| within a group {worst:.1e}.")
    return lines + [""]


def _verdict(target, summary):
    """'met' or MISSED, marked '(noisy)' when the per-repetition range straddles the bound."""
    verdict = CHECK if target.met(summary.median) else CROSS
    if summary.low <= target.bound <= summary.high:
        verdict += " (noisy)"
    return verdict


def _targets_summary(run):
    lines = ["## Targets", "",
             "Each target is checked on the median of the per-repetition wall-clock ratios "
             "(n repetitions; their range next to it). A verdict marked *(noisy)* has the "
             "bound inside that range: some repetitions were on the other side of it. The "
             "same ratio in CPU time (user + system seconds of each configuration's process "
             "per step, which other programs' load inflates much less) is an independent "
             "cross-check of the work each machinery does.", ""]
    rows = []
    for target in TARGETS:
        for model in run.models:
            for towers in run.tower_counts:
                if not target.applies_to(towers):
                    continue
                summary = run.ratio(model, towers, target.numerator, target.denominator,
                                    target.quantity)
                cpu = run.ratio(model, towers, target.numerator, target.denominator,
                                target.quantity, clock="cpu")
                cpu_text = f"{cpu.median:.3f}" if isinstance(cpu, measure.Summary) else cpu
                if isinstance(summary, measure.Summary):
                    rows.append([target.name, target.bound_text, model, str(towers),
                                 f"{summary.median:.4f}",
                                 f"{summary.low:.2f}-{summary.high:.2f} (n={summary.count})",
                                 _verdict(target, summary), cpu_text])
                else:
                    rows.append([target.name, target.bound_text, model, str(towers), "n/a",
                                 "", summary, cpu_text])
    return lines + _table(["ratio", "target", "model", "towers", "measured", "range",
                           "verdict", "CPU-time ratio"], rows, text_columns=3) + [""]


# Where the generated report ends in BENCHMARKS.md: the sections after this line
# are written by hand from the standalone benchmarks' output, and write_report
# keeps them when it writes the file again.
HAND_WRITTEN_MARKER = ("<!-- Sections below: written by hand from the standalone benchmarks "
                       "(bench/bench_*.py, bench/traffic.py); bench/run.py keeps them when it "
                       "writes this file again. -->")


def write_report(path, text):
    """Writes the rendered `text` to `path`, keeping what an existing file has from
    HAND_WRITTEN_MARKER on (the standalone benchmarks' sections)."""
    kept = ""
    if os.path.exists(path):
        with open(path) as existing:
            old = existing.read()
        if HAND_WRITTEN_MARKER in old:
            kept = "\n" + old[old.index(HAND_WRITTEN_MARKER):]
    with open(path, "w") as output:
        output.write(text + kept)


def render(meta: Dict, results: List, notes: Optional[List[str]] = None) -> str:
    """The whole BENCHMARKS.md text."""
    run = RunResults(results, meta["global_batch"])
    lines = _header(meta)
    lines += _targets_summary(run)
    for model in run.models:
        weights = meta.get("model_info", {}).get(model, {})
        lines += [f"## {model}" + (f" ({weights['num_weights'] / 1e6:.2f}M weights)"
                                   if weights.get("num_weights") else ""), ""]
        lines += _throughput_section(run, model, meta)
        lines += _ratio_section(run, model)
        lines += _scaling_section(run, model, meta["device_type"])
        lines += _construction_section(run, model)
        lines += _memory_section(run, model)
        lines += _weights_section(run, model)
    lines += _configurations_section()
    if notes:
        lines += notes + [""]
    lines += _raw_section(run)
    return "\n".join(lines).rstrip() + "\n"


def _raw_section(run):
    """Every timed segment's milliseconds per step, so any figure above can be re-derived."""
    lines = ["## Raw step times", "",
             "Wall-clock milliseconds per step of each timed segment, in repetition order "
             "(CPU milliseconds in parentheses).", "", "<details>", ""]
    rows = []
    for result in run.by_identity.values():
        config = result.config
        if not result.ok:
            cells = result.status
        else:
            cells = " ".join(
                "-" if wall is None else f"{1000 * wall:.0f} ({1000 * cpu:.0f})"
                for wall, cpu in zip(result.step_seconds, result.step_cpu_seconds))
        rows.append([config.model, str(config.num_towers), config.label, cells])
    lines += _table(["model", "towers", "configuration", "ms per step"], rows,
                    text_columns=4)
    return lines + ["", "</details>", ""]


def _configurations_section():
    return [
        "## What each configuration is", "",
        "- **towerlib *mode***: `towerlib.build_train_graph` with `bn_mode=mode`, variables "
        "on the host CPU, the global batch from a one-shot iterator split over the towers.",
        "- **hand-written towers** (`bench/handwritten.py`): the classic loop written from "
        "scratch (variables on /cpu:0 through a device function, `reuse_variables()` after "
        "tower 0, gradients averaged per variable, tower 0's `UPDATE_OPS` under the "
        "update's control dependencies).",
        "- **MirroredStrategy** (`bench/mirrored.py`): a `tf.function` step (traced at its "
        "first call only) calling `strategy.run`; each replica reads its slice of the same "
        "global batch from "
        "its own dataset; the v1 Momentum optimizer all-reduces the gradients (the "
        "strategy's default cross-device ops) and updates every mirror; batch-norm moving "
        "statistics are ON_READ/MEAN variables (no communication), as Keras makes them.",
        "- **one device, whole batch**: plain TF 1 graph code (`minimize` under "
        "`UPDATE_OPS`) on one device: the floor when the towers share the same cores.",
        "- **towerlib first_tower + CIFAR files**: the same towerlib step fed by the "
        "CIFAR-10 example's input pipeline (binary records, augmentation, shuffle, "
        "prefetch) instead of the in-memory batch.",
        "",
        "All of them run the same tower function (the CIFAR-10 example's model), start from "
        "the same weights (loaded by name from one file), use Momentum(0.9) with the same "
        "learning rate, and train on the same devices and global batch, each in its own "
        "process.",
        "",
    ]
