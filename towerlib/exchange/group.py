"""Where one process's towers sit among every tower of a multi-worker job.

On one machine the towers of a build are the whole collective group. Across
machines every worker builds its own towers, and the exchange spans all of
them: worker r's local tower i is member r * N + i of W * N, with N towers per
worker (one collective group of W * N, or a hub per worker and a group of W). The reducer's callers keep using local tower indices; the
reducer maps them to members.

    group = WorkerGroup(num_workers=2, worker_index=1)
    group.member(local_index=0, towers_per_worker=2)   # 2: worker 1's tower 0
    group.size(towers_per_worker=2)                    # 4 members in all

Worker 0 is the chief: its tower 0 (member 0) is "the first tower" of the
whole job, whose values a broadcast sends and whose shard `bn_mode=
'first_tower'` takes its statistics from.
"""

import dataclasses
import numbers

__all__ = ["ONE_WORKER", "WorkerGroup"]


@dataclasses.dataclass(frozen=True)
class WorkerGroup:
    """This process's place among the job's workers.

    Attributes:
      num_workers: W >= 1, the processes that train, each with the same
        number of towers.
      worker_index: 0..W-1, this process; 0 is the chief.
    """

    num_workers: int = 1
    worker_index: int = 0

    def __post_init__(self):
        for name in ("num_workers", "worker_index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"WorkerGroup({name}={value!r}) must be an int.")
            object.__setattr__(self, name, int(value))  # numpy ints too
        if self.num_workers < 1:
            raise ValueError(f"WorkerGroup(num_workers={self.num_workers}): at least 1.")
        if not 0 <= self.worker_index < self.num_workers:
            raise ValueError(
                f"WorkerGroup(worker_index={self.worker_index}) is outside "
                f"0..{self.num_workers - 1} for num_workers={self.num_workers}.")

    @property
    def spans_workers(self) -> bool:
        """Whether the exchange crosses between processes."""
        return self.num_workers > 1

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0

    def size(self, towers_per_worker: int) -> int:
        """Members of the collective group: W * N."""
        return self.num_workers * towers_per_worker

    def member(self, local_index: int, towers_per_worker: int) -> int:
        """The group member of this worker's tower `local_index`."""
        return self.worker_index * towers_per_worker + local_index


ONE_WORKER = WorkerGroup()
