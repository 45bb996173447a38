"""The cluster of a Slurm job step, as `srun` describes it in the environment.

`srun -N 2 --ntasks-per-node=1 python train.py` starts one task per worker; each
finds its place in SLURM_PROCID (its rank), SLURM_STEP_NUM_TASKS,
SLURM_STEP_NODELIST ('node[1-2]') and SLURM_STEP_TASKS_PER_NODE ('1(x2)').
TensorFlow's `tf.distribute.cluster_resolver.SlurmClusterResolver` turns them
into a ClusterSpec: ports port_base, port_base + 1, ... for the tasks of one
node, the hosts put back in the nodelist's order (the ranks' order; the resolver
sorts them as strings). Tasks are distributed in blocks (srun's default). Every task is a 'worker' (all-reduce; worker 0 is
the chief); the towers are the task's own devices.

GPUs: when Slurm has already bound devices to the task (CUDA_VISIBLE_DEVICES is
set) towerlib keeps them; when the node has GPUs and nothing is bound,
the resolver splits them evenly between the node's tasks (it sets
CUDA_VISIBLE_DEVICES before TensorFlow first looks at the devices); on a CPU
node there is nothing to split.
"""

import contextlib
import os
import shutil

import tensorflow as tf

PORT_BASE_VARIABLE = "TOWERLIB_SLURM_PORT_BASE"
DEFAULT_PORT_BASE = 8888
# The variables srun sets for each task of a job step, that the resolver reads.
REQUIRED = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
            "SLURM_STEP_TASKS_PER_NODE")


def in_slurm_step(environ=None):
    """Whether this process is one of several tasks of a Slurm job step.

    A step of one task (a batch script, `srun -n 1`) is one machine: no cluster.
    """
    environ = os.environ if environ is None else environ
    return "SLURM_PROCID" in environ and environ.get("SLURM_STEP_NUM_TASKS", "1") != "1"


def _port_base(environ):
    text = environ.get(PORT_BASE_VARIABLE, "")
    if not text:
        return DEFAULT_PORT_BASE
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{PORT_BASE_VARIABLE}={text!r}: give the first port of each "
                         "node's tasks, an integer in 1..65535.")
    return int(text)


def _gpu_options(num_tasks, environ):
    """The resolver's GPU arguments: split the node's GPUs only if none are bound."""
    if "CUDA_VISIBLE_DEVICES" not in environ and shutil.which("nvidia-smi"):
        return {}
    # Nothing to split (a CPU node) or already split by Slurm: an allocation the
    # resolver computes and never applies (one pretend device per task).
    return {"gpus_per_node": num_tasks, "gpus_per_task": 1, "auto_set_gpu": False}


def cluster_from_slurm(environ=None):
    """The (jobs, job_name, task_index) of this Slurm task, read from `environ`.

    TensorFlow's resolver reads os.environ itself: when `environ` is another
    mapping, its Slurm variables stand in os.environ while the resolver runs.

    Raises:
      ValueError: naming the Slurm variable that is missing or malformed.
    """
    environ = os.environ if environ is None else environ
    num_tasks = _checked_task_count(environ)
    try:
        with _shown_to_the_resolver(environ):
            resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
                port_base=_port_base(environ), **_gpu_options(num_tasks, environ))
            spec = resolver.cluster_spec().as_dict()
    except (RuntimeError, ValueError, IndexError) as error:
        raise ValueError(
            f"Slurm: the job step's variables do not describe a cluster ({error}): "
            f"SLURM_PROCID={environ['SLURM_PROCID']!r}, SLURM_STEP_NUM_TASKS={num_tasks!r}, "
            f"SLURM_STEP_NODELIST={environ['SLURM_STEP_NODELIST']!r}, "
            f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']!r}.") from None
    job_name, task_index = resolver.get_task_info()
    _check_ports(spec, environ)
    # The resolver lists hosts sorted as strings ('gpu10' before 'gpu9'); Slurm numbers
    # the ranks in the nodelist's order, node by node: put the addresses in that order.
    order = {host: i for i, host in enumerate(
        expand_hostlist(environ["SLURM_STEP_NODELIST"]))}
    jobs = {job: tuple(sorted(hosts, key=lambda address: (
        order.get(address.rpartition(":")[0], len(order)),
        int(address.rpartition(":")[2])))) for job, hosts in spec.items()}
    return jobs, job_name, task_index


def _checked_task_count(environ):
    """SLURM_STEP_NUM_TASKS, after checking every variable and SLURM_PROCID's range."""
    missing = [name for name in REQUIRED if name not in environ]
    if missing:
        raise ValueError(
            f"Slurm: {', '.join(missing)} not set, though SLURM_PROCID is. Start each "
            "task with srun inside the allocation (srun sets them for a job step), "
            "or describe the cluster with TF_CONFIG or --worker_hosts instead.")
    num_tasks, rank = environ["SLURM_STEP_NUM_TASKS"], environ["SLURM_PROCID"]
    if not num_tasks.isdigit() or int(num_tasks) < 1:
        raise ValueError(f"Slurm: SLURM_STEP_NUM_TASKS={num_tasks!r} is not a task count.")
    if rank.isdigit() and int(rank) >= int(num_tasks):
        raise ValueError(
            f"Slurm: SLURM_PROCID={rank} is outside this job step's {num_tasks} tasks "
            f"(ranks 0..{int(num_tasks) - 1}): the variables come from different steps. "
            "Fix: start every task with one srun, or unset the stale SLURM_* variables.")
    return int(num_tasks)


@contextlib.contextmanager
def _shown_to_the_resolver(environ):
    """environ's Slurm variables in os.environ while TensorFlow's resolver reads them."""
    if environ is os.environ:
        yield
        return
    saved = {name: os.environ.get(name) for name in REQUIRED}
    try:
        os.environ.update({name: environ[name] for name in REQUIRED})
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _check_ports(spec, environ):
    """Refuses a port base whose node's last task would get a port past 65535."""
    highest = max(int(address.rpartition(":")[2])
                  for hosts in spec.values() for address in hosts)
    if highest > 65535:
        base = _port_base(environ)
        raise ValueError(
            f"Slurm: {PORT_BASE_VARIABLE}={base} gives a node's tasks the ports {base}.."
            f"{highest}, past 65535. Fix: a port base of at most {base - (highest - 65535)}.")


def expand_hostlist(text):
    """Slurm's compact host list in its order: 'gpu[9-10],cpu01' -> gpu9, gpu10, cpu01.

    A bracket holds ranges and single numbers ('n[01-03,7]'); a range keeps the
    zero padding of its first number.
    """
    hosts, depth, start = [], 0, 0
    for index, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            hosts += _expand_one(text[start:index].strip())
            start = index + 1
    return [host for host in hosts if host]


def _expand_one(item):
    prefix, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    ranges, _, suffix = rest.partition("]")
    names = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        width = len(first) if first.startswith("0") else 0
        for number in range(int(first), int(last or first) + 1):
            names += [f"{prefix}{number:0{width}d}{tail}" for tail in _expand_one(suffix)]
    return names
