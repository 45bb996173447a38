"""TraceHook: trace chosen training steps, and say whether the towers ran in parallel.

    hook = towerlib.trace.TraceHook(steps=[100, 1000], output_dir=train_dir,
                                    global_step=train.global_step,
                                    tower_devices=train.devices)
    towerlib.run_training(train, train_dir=train_dir, max_steps=2000, hooks=[hook])

Steps are numbered as the training log numbers them: step s is the run of
the train op that takes global_step from s - 1 to s (the value read after
it). For each chosen step the hook

  - adds the RunMetadata to TensorBoard as run metadata tagged 'step_<s>'
    (the Graphs tab shows it per op), through `summary_writer` or
    tf.compat.v1.summary.FileWriterCache.get(output_dir), and flushes;
  - writes output_dir/traces/trace_step_<s>.json (towerlib.trace.chrome)
    and, when matplotlib is installed, trace_step_<s>.png
    (towerlib.trace.picture): in their own folder, apart from the
    checkpoints and event files; a local path (written with open()). A
    'traces' that is a link, a file, or a folder holding other files than
    traces is refused (ValueError, one line) in begin, never written through;
  - logs the step's summary line to the 'towerlib' logger (INFO) and keeps
    the StepProfile in `hook.profiles[s]`.

How it knows the coming step without a run of its own: it fetches
global_step with every run (a read with no inputs, run at the start of the
run: the value before the update) and expects the next run to produce that
value + 1; the first run's predecessor is read in after_create_session. A
run is traced when the step it is expected to produce is chosen. After a
traced run the hook reads global_step once more (the one extra read, on
traced runs only): the trace is kept, as that step, only if the run moved
global_step onto a chosen step. A run of something else through the same
session (a fetch of the loss or of the step alone) moves nothing: its trace
is dropped, the count corrected, and the next run traced instead; so such
runs cost a trace now and then but never shift or hide the chosen step.
Untraced runs get no RunOptions and no fetch but global_step.
"""

import logging
import os
import re
from typing import Dict, Iterable, Optional, Sequence

import tensorflow as tf

from towerlib.trace import analysis, chrome, picture

__all__ = ["TraceHook"]

logger = logging.getLogger("towerlib")

TRACES_FOLDER = "traces"


_TRACE_FILE = re.compile(r"^\.?trace_step_\d+\.(json|png)(\.[^/]+\.tmp)?$")


def _check_traces_folder(folder):
    """Refuses, in one line, a traces folder that is a symbolic link (the traces would
    overwrite the files it points at), not a folder, or a folder holding files the hook
    does not write; an absent one is fine (made on the first trace)."""
    if not os.path.lexists(folder):
        return
    if os.path.islink(folder) or not os.path.isdir(folder):
        what = (f"a symbolic link to {os.readlink(folder)}" if os.path.islink(folder)
                else "not a folder")
        raise ValueError(
            f"{folder} is {what}; TraceHook writes its traces there itself and never "
            "through a link or over a user's file. Fix: remove it (a link's target is left "
            "as it is), or give another output_dir.")
    foreign = sorted(n for n in os.listdir(folder) if not _TRACE_FILE.match(n))
    if foreign:
        raise ValueError(
            f"{folder} holds files TraceHook does not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}): a user's folder, whose files a trace "
            "of the same name would overwrite. Fix: move it away, or give another "
            "output_dir.")


class TraceHook(tf.compat.v1.train.SessionRunHook):
    """Traces the runs producing `steps` (see the module doc).

    Args:
      steps: the global steps to trace, e.g. [100, 1000] or range(100, 10**6, 1000).
        Read once, here: an infinite iterable is refused.
      output_dir: the TensorBoard folder (the train_dir); files go to its
        'traces' subfolder.
      global_step: the step variable or tensor (TrainGraph.global_step);
        None: tf.compat.v1.train.get_global_step() when the session starts.
      tower_devices: the towers' devices in tower order (TrainGraph.devices),
        for the analysis; None finds them from the trace.
      summary_writer: a tf.compat.v1.summary.FileWriter; None: the cached
        writer of output_dir.

    Attributes:
      profiles: {step: StepProfile} of the steps traced so far.
    """

    def __init__(self, steps: Iterable[int], output_dir, global_step=None,
                 tower_devices: Optional[Sequence[str]] = None, summary_writer=None):
        self._steps = frozenset(int(s) for s in steps)
        self._output_dir = str(output_dir)
        self._global_step = global_step
        self._tower_devices = list(tower_devices) if tower_devices is not None else None
        self._writer = summary_writer
        self._previous: Optional[int] = None
        self._tracing = False
        self.profiles: Dict[int, analysis.StepProfile] = {}

    @property
    def traces_dir(self) -> str:
        return os.path.join(self._output_dir, TRACES_FOLDER)

    def begin(self):
        if self._global_step is None:
            self._global_step = tf.compat.v1.train.get_global_step()
            if self._global_step is None:
                raise ValueError("TraceHook needs global_step: the graph has none "
                                 "(pass TrainGraph.global_step).")
        if self._writer is None:
            self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)
        _check_traces_folder(self.traces_dir)

    def after_create_session(self, session, coord):
        del coord
        self._previous = int(session.run(self._global_step))
        passed = sorted(s for s in self._steps if s <= self._previous)
        if passed:  # a resumed run: say what will not be traced, once
            logger.warning(
                "trace_steps %s %s at or before global step %d, where this run starts: "
                "%s. Fix: ask for later steps to trace them in this run.",
                passed, "is" if len(passed) == 1 else "are", self._previous,
                "nothing will be traced" if len(passed) == len(self._steps)
                else "those are not traced")

    def before_run(self, run_context):
        del run_context
        self._tracing = self._previous is not None and self._previous + 1 in self._steps
        options = (tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
                   if self._tracing else None)
        return tf.compat.v1.train.SessionRunArgs(None, options=options)

    def after_run(self, run_context, run_values):
        # The step is read after the run, not fetched with it: a read in the same run as
        # the train op may come before or after its increment (no dependency orders them).
        before, tracing = self._previous, self._tracing
        self._tracing = False
        self._previous = int(run_context.session.run(self._global_step))
        if tracing and self._previous > before and self._previous in self._steps:
            self._record(self._previous, run_values.run_metadata)

    def _record(self, step, run_metadata):
        self._writer.add_run_metadata(run_metadata, f"step_{step}", global_step=step)
        self._writer.flush()
        profile = analysis.analyze_step(run_metadata, self._tower_devices, step=step)
        _check_traces_folder(self.traces_dir)  # again: it may have changed since begin
        os.makedirs(self.traces_dir, exist_ok=True)
        base = os.path.join(self.traces_dir, f"trace_step_{step}")
        written = [chrome.write_chrome_trace(run_metadata, base + ".json", profile=profile)]
        image = picture.write_step_picture(profile, base + ".png")
        if image is not None:
            written.append(image)
        self.profiles[step] = profile
        logger.info("%s; %s", profile.summary_line(), ", ".join(written))
