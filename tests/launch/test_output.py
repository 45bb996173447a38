"""Each task's lines whole and prefixed, however many tasks write at once."""

import io
import os
import re
import threading

from towerlib.launch.output import Output
from towerlib.launch.plan import Task


def test_lines_of_many_tasks_never_mix_mid_line():
    out, err = io.BytesIO(), io.BytesIO()
    output = Output(out, err)
    tasks = [Task("worker", i) for i in range(4)]
    pipes, readers = [], []
    for task in tasks:
        read_end, write_end = os.pipe()
        pipes.append(write_end)
        readers.append(output.follow(task, os.fdopen(read_end, "rb"), to_stderr=task.index == 3))

    def write(task, fd):
        for i in range(200):
            os.write(fd, f"line {i} of {task.name} {'x' * (1000 + 97 * i)} end\n".encode())
        os.write(fd, b"no newline at the end")
        os.close(fd)

    writers = [threading.Thread(target=write, args=(t, fd)) for t, fd in zip(tasks, pipes)]
    for thread in writers + []:
        thread.start()
    for thread in writers + readers:
        thread.join(30)
    line = re.compile(rb"^\[(worker \d)\] (line \d+ of (worker \d) x+ end|no newline at the end)$")
    counts = {}
    for stream in (out, err):
        for text in stream.getvalue().split(b"\n")[:-1]:
            match = line.match(text)
            assert match, text[:120]
            assert match.group(3) in (None, match.group(1))
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    assert counts == {f"worker {i}".encode(): 201 for i in range(4)}
    assert b"[worker 3]" in err.getvalue() and b"[worker 3]" not in out.getvalue()
    assert output.last_line(tasks[0]) == "no newline at the end"


def test_hidden_tasks_are_not_written_but_their_last_line_is_kept():
    out = io.BytesIO()
    shown, hidden = Task("worker", 0), Task("worker", 1)
    output = Output(out, io.BytesIO(), shown={shown})
    output.task_line(shown, b"shown line\n")
    output.task_line(hidden, b"hidden line\n")
    output.task_line(hidden, b"   \n")
    assert out.getvalue() == b"[worker 0] shown line\n"
    assert output.last_line(hidden) == "hidden line"
    output.note("summary: done")


class ClosedPipe(io.BytesIO):
    def write(self, data):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_does_not_stop_the_reading():
    """`towerlib-launch ... | head`: once head is gone, the task's lines are still read
    (dropped), so the task never blocks on a full pipe."""
    output = Output(ClosedPipe(), ClosedPipe())
    task = Task("worker", 0)
    read_end, write_end = os.pipe()
    reader = output.follow(task, os.fdopen(read_end, "rb"))
    for i in range(2000):   # far more than a pipe holds
        os.write(write_end, b"y" * 100 + b" %d\n" % i)
    os.close(write_end)
    reader.join(30)
    assert not reader.is_alive()
    assert output.last_line(task).endswith(" 1999")
    output.note("summary: done")
