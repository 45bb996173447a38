"""The machine's living processes, read from /proc: what a test started and left behind.

    session_members(process.pid)   # every living process of a session a test started
    descendants()                  # {pid: start time} of every living process under this one
"""

import os


def living_processes():
    """{pid: the fields of /proc/<pid>/stat after the command name} of every process that
    is not a zombie (fields[0] is the state, [1] the parent, [3] the session, [19] the
    start time)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(name)] = fields
    return found


def session_members(session_id):
    """The pids of the living processes of session `session_id`."""
    return [pid for pid, fields in living_processes().items() if int(fields[3]) == session_id]


def descendants(root=None):
    """{pid: start time} of every living process under `root` (default: this one)."""
    root = os.getpid() if root is None else root
    children, start = {}, {}
    for pid, fields in living_processes().items():
        children.setdefault(int(fields[1]), []).append(pid)
        start[pid] = fields[19]
    found, queue = {}, list(children.get(root, ()))
    while queue:
        pid = queue.pop()
        found[pid] = start[pid]
        queue.extend(children.get(pid, ()))
    return found
