"""Bytes each device sends and receives per training step, counted from the graph.

    python -m bench.traffic --towers=2,4,8 --models=resnet20,resnet50_sized \
        --bandwidths_gbps=12,150 --global_batch=128

No GPU is needed: the training graph is built with GPU device strings
('/device:GPU:0', ...) and never run. For each model and tower count it builds
the three ways towerlib can update the variables,

  ps/cpu      update=towerlib.ParameterServer(device='cpu')
  ps/gpu      update=towerlib.ParameterServer(device='gpu')
  replicated  update='replicated', exchange='collective' (NCCL)

counts what crosses between devices in one step and prints two markdown
tables: the busiest device's bytes sent and received, the bytes moved in
all, and the step-time floor that traffic implies on links of the given
bandwidths; then the bytes by kind. Progress (and, with --details, each
row's largest transfers) goes to stderr.

This module is the command line only; the work is done by

  traffic_placement.py  which ops a step runs and on which device (the placer's rules)
  traffic_count.py      the bytes crossing devices: graph edges, ring collectives
  traffic_model.py      ResNet50Sized, ResNet-50's weights on 32x32 images
  traffic_rows.py       one (model, towers, update): build on GPU strings, count
  traffic_tables.py     the two Markdown tables

Method and findings: BENCHMARKS.md, "Traffic per step, counted from the graph".

Across machines: with --machines, each machine count W is built
as one worker of W machines x --devices GPUs, all-reduce and parameter
server, and the bytes each machine's link carries per step are reported
(bench/traffic_machines.py, bench/traffic_machines_report.py):

    python -m bench.traffic --machines=2,4,8 --devices=8 \
        --output=docs/traffic_across_machines.md
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.traffic_rows import VARIABLE_UPDATES, build_and_count  # noqa: E402
from bench.traffic_tables import breakdown_table, markdown_table  # noqa: E402


def _define_flags():
    from absl import flags
    flags.DEFINE_list("towers", ["2", "4", "8"], "Tower counts.")
    flags.DEFINE_list("models", ["resnet20", "resnet50_sized"],
                      "resnet50_sized, or models of examples/cifar10/models.py.")
    flags.DEFINE_list("updates", [label for label, _ in VARIABLE_UPDATES],
                      "Variable updates to count: ps/cpu, ps/gpu, replicated.")
    flags.DEFINE_list("bandwidths_gbps", ["12", "150"],
                      "Link bandwidths in GB/s (defaults: PCIe 3.0 x16 ~12, NVLink 150).")
    flags.DEFINE_integer("global_batch", 128, "Examples per step over all towers "
                         "(only the input batch's bytes depend on it).")
    flags.DEFINE_string("bn_mode", "first_tower", "Batch-norm mode of the builds.")
    flags.DEFINE_bool("details", False, "Also list each row's cross-device edges by size.")
    flags.DEFINE_list("machines", [], "Machine counts W: report the traffic per machine "
                      "link of W machines x --devices GPUs instead (--models defaults to "
                      "resnet50_sized there).")
    flags.DEFINE_integer("devices", 8, "With --machines: GPUs (towers) per machine.")
    flags.DEFINE_integer("ps_tasks", 0, "With --machines: ps tasks P (0: P = W).")
    flags.DEFINE_list("link_gbits", ["25", "100"],
                      "With --machines: machine link speeds in Gb/s.")
    flags.DEFINE_integer("batch_per_tower", 32, "With --machines: images per GPU.")
    flags.DEFINE_string("output", "", "With --machines: write the page here "
                        "(e.g. docs/traffic_across_machines.md); default: print it.")
    return flags.FLAGS


def _count_rows(flags_values):
    """Every (model, towers, update) of the flags, counted, in that order."""
    rows = []
    for model_name in flags_values.models:
        for num_towers in (int(t) for t in flags_values.towers):
            for update in flags_values.updates:
                row = build_and_count(model_name, num_towers, update,
                                      flags_values.global_batch, flags_values.bn_mode)
                rows.append(row)
                print(f"counted {model_name} x{num_towers} {update}: "
                      f"{len(row.traffic.edges)} cross-device edges, "
                      f"{len(row.traffic.collectives)} collective ops, "
                      f"unsized: {len(row.traffic.unsized)}", file=sys.stderr, flush=True)
                if flags_values.details:
                    for edge in sorted(row.traffic.edges, key=lambda e: -e.num_bytes)[:40]:
                        print(f"    {edge.num_bytes:>12,d} B {edge.kind:9s} {edge.source} -> "
                              f"{edge.destination}  {edge.tensor}", file=sys.stderr)
    return rows


def _machines_report(flags_values):
    """The page of traffic per machine link (--machines), printed or written to --output."""
    from bench import traffic_machines_report as report
    models = flags_values.models if FLAGS["models"].present else ["resnet50_sized"]
    machines = [int(w) for w in flags_values.machines]
    bandwidths = [float(w) for w in flags_values.link_gbits]
    command = (f"python -m bench.traffic --machines={','.join(map(str, machines))} "
               f"--devices={flags_values.devices} --models={','.join(models)} "
               f"--link_gbits={','.join(flags_values.link_gbits)}")
    for name in ("ps_tasks", "batch_per_tower", "bn_mode"):
        if FLAGS[name].present:
            command += f" --{name}={getattr(flags_values, name)}"
    if flags_values.output:
        command += f" \\\n    --output={flags_values.output}"
    rows = report.count_rows(models, machines, flags_values.devices, flags_values.ps_tasks,
                             flags_values.batch_per_tower, flags_values.bn_mode)
    page = report.report_page(rows, bandwidths, command, flags_values.batch_per_tower,
                              flags_values.bn_mode)
    if flags_values.output:
        with open(flags_values.output, "w") as f:
            f.write(page)
        print(f"wrote {flags_values.output}", file=sys.stderr)
    else:
        print(page)


def main(argv):
    del argv
    flags_values = FLAGS  # defined by _define_flags when run as a script
    if flags_values.machines:
        _machines_report(flags_values)
        return
    rows = _count_rows(flags_values)
    print(f"Global batch {flags_values.global_batch} of 32x32x3 float32 images made on "
          f"the host CPU, Momentum, bn_mode={flags_values.bn_mode}; towers on GPU device "
          "strings, graphs built and never run.\n")
    print(markdown_table(rows, [float(w) for w in flags_values.bandwidths_gbps]))
    print()
    print(breakdown_table(rows))


if __name__ == "__main__":
    from absl import app
    FLAGS = _define_flags()
    app.run(main)
