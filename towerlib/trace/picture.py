"""A traced step as a PNG: one lane per device, its ops coloured by phase.

    write_step_picture(profile, "trace_step_21.png")   # the path, or None

The x axis is milliseconds from the step's first op; each device the
analysis kept (towerlib.trace.lanes.device_events: a GPU's streams drawn
as one lane) is a row, the towers' devices first in tower order. Within a
row a phase is drawn as the union of its ops' intervals, the phases in
reverse priority so that an exchange shows above the compute around it.
The title is the profile's summary line.

matplotlib is optional: it is imported here, when a picture is asked for,
and drawn through its Agg canvas (no pyplot, no change to the process's
backend). Without it the function logs one line saying how to install it
and returns None.
"""

import logging
import textwrap
from typing import Optional

from towerlib.trace import analysis, atomic, intervals, phases

__all__ = ["PHASE_COLOURS", "write_step_picture"]

logger = logging.getLogger("towerlib")

PHASE_COLOURS = {
    phases.COMPUTE: "#4c72b0",
    phases.EXCHANGE: "#dd8452",
    phases.APPLY: "#55a868",
    phases.INPUT: "#c44e52",
    phases.OTHER: "#9a9a9a",
}

_LOCAL_PREFIX = "/job:localhost/replica:0/task:0"


def _lane_label(device, towers):
    name = device[len(_LOCAL_PREFIX):] if device.startswith(_LOCAL_PREFIX) else device
    if towers:
        name += " (tower " + ", ".join(str(t) for t in towers) + ")"
    return name


def write_step_picture(profile: analysis.StepProfile, path) -> Optional[str]:
    """Draws `profile` into the PNG `path` (written atomically).

    Returns:
      `path` as a str, or None when matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        logger.info("No picture of the traced step: matplotlib is not installed "
                    "(pip install -e '.[plot]', or pip install matplotlib, gives it).")
        return None

    order = sorted(profile.devices, key=lambda d: (not d.towers, d.towers))
    figure = Figure(figsize=(12, 1.6 + 0.45 * max(len(order), 1)), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    origin = profile.start_micros
    for row, device in enumerate(order):
        own = [op for op in profile.ops if op.event.device == device.device]
        for phase in reversed(phases.PRIORITY):
            spans = intervals.union((op.event.start, op.event.end)
                                    for op in own if op.phase == phase)
            if spans:
                axes.broken_barh([((start - origin) / 1000, (end - start) / 1000)
                                  for start, end in spans],
                                 (row - 0.4, 0.8), facecolors=PHASE_COLOURS[phase],
                                 linewidth=0)
    axes.set_yticks(range(len(order)))
    axes.set_yticklabels([_lane_label(d.device, d.towers) for d in order], fontsize=8)
    axes.set_ylim(len(order) - 0.5, -0.5)
    axes.set_xlim(0, max(profile.span_micros, 1) / 1000)
    axes.set_xlabel("milliseconds from the step's first op")
    axes.legend(handles=[Patch(color=PHASE_COLOURS[p], label=p) for p in phases.PHASES],
                loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axes.set_title("\n".join(textwrap.wrap(profile.summary_line(), 110)), fontsize=9,
                   loc="left")
    figure.tight_layout()
    path = str(path)
    with atomic.replacing(path) as temporary:
        figure.savefig(temporary, format="png")
    return path
