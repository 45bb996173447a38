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
