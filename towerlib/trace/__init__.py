"""Traced steps: is the tower loop executed serially or in parallel?

    md = tf.compat.v1.RunMetadata()
    sess.run(train.train_op, run_metadata=md, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    profile = towerlib.trace.analyze_step(md, train.devices, step=21)
    print(profile.summary_line())
    towerlib.trace.write_chrome_trace(md, "step_21.json", profile=profile)
    towerlib.trace.write_step_picture(profile, "step_21.png")  # needs matplotlib

or, in a training loop, towerlib.trace.TraceHook(steps=[21], output_dir=...,
global_step=train.global_step).

The package, one job per module:

  analysis.py   analyze_step -> StepProfile: span, per-tower busy time, how
                much the towers overlap, phase times that add up to the step
  phases.py     an op's phase (compute, exchange, apply, input, other) and
                tower, from its name scopes and op type
  lanes.py      reading step_stats: one event per op execution, GPU stream
                and memcpy lanes counted once
  intervals.py  unions, lengths, coverage counts and a priority partition
                of integer time intervals
  chrome.py     the step as a Chrome / Perfetto trace (JSON)
  picture.py    the step as a PNG, one lane per device (matplotlib, optional)
  hook.py       TraceHook: the above for chosen global steps, into TensorBoard
                and output_dir/traces
  atomic.py     files written whole or not at all

Only the step's own RunMetadata is read; nothing here changes the graph.
"""

from towerlib.trace.analysis import DeviceProfile, StepOp, StepProfile, TowerProfile, analyze_step
from towerlib.trace.chrome import chrome_trace, write_chrome_trace
from towerlib.trace.hook import TraceHook
from towerlib.trace.phases import PHASES, PRIORITY, classify
from towerlib.trace.picture import write_step_picture

__all__ = [
    "DeviceProfile", "PHASES", "PRIORITY", "StepOp", "StepProfile", "TowerProfile",
    "TraceHook", "analyze_step", "chrome_trace", "classify", "write_chrome_trace",
    "write_step_picture",
]
