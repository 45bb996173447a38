"""A built training graph in its own Session, stepped and timed.

The benchmarks that compare variants of one step (bench_bn_modes.py,
bench_variable_update.py) build each variant's graph once, then time it in
interleaved repetitions; this is what they share.
"""

import time


class SteppedGraph:
    """Subclasses build `self.graph`, `self.session` and `self.train_op`."""

    graph = None
    session = None
    train_op = None

    def count_collectives(self):
        """Collective ops in the graph (a sync or all-reduce variant has some)."""
        return sum(op.type.startswith("Collective") for op in self.graph.get_operations())

    def seconds_per_step(self, steps):
        """(wall seconds, process CPU seconds) per step, averaged over `steps`."""
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.session.run(self.train_op)
        return ((time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps)

    def close(self):
        self.session.close()


def interleaved_samples(runs, key, warmup_steps, repetitions, steps_per_repetition):
    """{key(run): [(wall, cpu) seconds per step, one per repetition]}, then closes the runs.

    Every repetition times each run once, in an order rotated by one each
    repetition, so that load from other processes spreads over the runs.
    """
    try:
        for run in runs:
            run.seconds_per_step(warmup_steps)
        samples = {key(run): [] for run in runs}
        for repetition in range(repetitions):
            shift = repetition % len(runs)
            for run in runs[shift:] + runs[:shift]:
                samples[key(run)].append(run.seconds_per_step(steps_per_repetition))
        return samples
    finally:
        for run in runs:
            run.close()
