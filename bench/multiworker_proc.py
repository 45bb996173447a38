"""One process of bench/bench_multiworker.py: a worker, a ps task, or one whole machine.

    python -m bench.multiworker_proc '<json job>'

Roles (job["role"]):

  single      towerlib.run_training in one process on job["towers"] towers
              (update=towerlib.Replicated()).
  allreduce   worker r of an all-reduce job: build_sync_train_graph(...,
              update=towerlib.Replicated()) + run_distributed_training, no ps.
  allreduce_flat
              the allreduce role with every tower of every worker one member
              of one collective group (W x N), as before CPU towers met in
              per-worker hubs (towerlib.exchange.worker_hubs): for comparison.
  allreduce_plain
              the allreduce role's graph in a plain session.run loop (as mwms):
              TrainGraph.initialize, then session.run([train_op, loss]).
  ps_worker   worker r of the parameter-server path: build_sync_train_graph
              with a ParameterServerPlacer + run_distributed_training.
  ps          the ps task of that path: run_parameter_server.
  mwms        worker r under tf.compat.v1.distribute.experimental.
              MultiWorkerMirroredStrategy in graph mode: a Session on the
              worker's server, a plain session.run loop.

Every training role trains the same model (bench.models, from the CIFAR-10
example) from the same initial weights (job["weights_path"], drawn once by
bench.worker's 'prepare' task) on the same fixed global batch
(bench.inputs.synthetic_batch); worker r of W takes rows [r B/W, (r+1) B/W),
and its towers split those as towerlib splits a batch.

Protocol (as bench/worker.py): replies are JSON lines on the process's
original stdout, everything else goes to stderr. When the session is ready,
right before the first step, a training role replies {"ready": ...} and then
obeys commands read from stdin:

    {"command": "run", "steps": k}  ->  {"seconds": [...], "run_seconds": [...],
                                         "losses": [...]}

`seconds[i]` is the wall time of the i-th step of the segment, from the end
of the step before it (or from the command's arrival) to the end of this one:
a whole iteration of the training loop, hooks included. `run_seconds[i]` is
the part from the stepping hook's before_run to its after_run (for the
plain loop: the session.run), i.e. without most of the training loop's
Python and hooks. `losses[i]` is the
step's loss as this process sees it (see global_loss in bench_multiworker).
The process stops by itself once job["max_steps"] steps have run, which the
coordinator sets to the sum of the segments it will ask for; the last
segment's reply is then sent from the hook's end().
"""

import json
import os
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROLES = ("single", "allreduce", "allreduce_flat", "allreduce_plain", "ps_worker", "ps",
         "mwms")


def _protocol_stream():
    """A private copy of stdout for replies; fd 1 then points at stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return replies


class Stepper:
    """Holds the training loop at segment boundaries and times the steps in between.

    `before_step()` is called right before each step (it blocks on stdin for
    the next command when the current segment is done), `after_step(loss)`
    right after it, `end()` once the loop is over.
    """

    def __init__(self, replies, ready_message):
        self._replies = replies
        self._ready = dict(ready_message)
        self._remaining = 0
        self._last = None
        self._seconds, self._run_seconds, self._losses = [], [], []
        self._run_start = None
        self._announced = False

    def _reply(self, message):
        self._replies.write(json.dumps(message) + "\n")
        self._replies.flush()

    def _flush_segment(self):
        if self._seconds:
            self._reply({"seconds": self._seconds, "run_seconds": self._run_seconds,
                         "losses": self._losses})
            self._seconds, self._run_seconds, self._losses = [], [], []

    def before_step(self):
        if not self._announced:
            self._announced = True
            self._reply(dict(self._ready, ready=True))
        if self._remaining == 0:
            self._flush_segment()
            line = sys.stdin.readline()
            if not line:
                raise SystemExit("bench_multiworker: the coordinator went away")
            command = json.loads(line)
            if command.get("command") != "run":
                raise ValueError(f"Unknown command {command!r}")
            self._remaining = int(command["steps"])
            self._last = time.perf_counter()
        self._run_start = time.perf_counter()

    def after_step(self, loss):
        now = time.perf_counter()
        self._seconds.append(now - self._last)
        self._run_seconds.append(now - self._run_start)
        self._losses.append(float(loss))
        self._last = now
        self._remaining -= 1

    def end(self):
        self._flush_segment()


def _stepping_hook(stepper, loss):
    import tensorflow as tf

    class SteppingHook(tf.compat.v1.train.SessionRunHook):
        def before_run(self, run_context):
            stepper.before_step()
            return tf.compat.v1.train.SessionRunArgs(loss)

        def after_run(self, run_context, run_values):
            stepper.after_step(run_values.results)

        def end(self, session):
            stepper.end()

    return SteppingHook()


def _load_model_and_data(job):
    from bench import inputs as inputs_lib
    from bench import models, weights
    model = models.load_model(job["model"])
    values, trainable = weights.read_weights(job["weights_path"])
    images, labels = inputs_lib.synthetic_batch(job["global_batch"], job["seed"])
    return model, values, trainable, images, labels


def _worker_rows(job, images, labels):
    """This worker's contiguous share of the global batch (shares differ by <= 1)."""
    workers, task = job.get("workers", 1), job.get("task", 0)
    base, extra = divmod(len(labels), workers)
    sizes = [base + (1 if r < extra else 0) for r in range(workers)]
    start = sum(sizes[:task])
    return images[start:start + sizes[task]], labels[start:start + sizes[task]]


def _initialized_from(model, values):
    """The model's tower function with every saved variable initialized to its saved value."""
    import tensorflow as tf

    def set_initializer(getter, name, *args, **kwargs):
        if name in values:
            kwargs["initializer"] = tf.compat.v1.constant_initializer(values[name])
        return getter(name, *args, **kwargs)

    def tower_fn(inputs, ctx):
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                         custom_getter=set_initializer):
            return model.tower_fn(inputs, ctx)

    return tower_fn


def _optimizer(job):
    import tensorflow as tf
    return tf.compat.v1.train.MomentumOptimizer(job["learning_rate"], 0.9)


def _cluster(job, ps):
    from towerlib import cluster as cluster_lib
    hosts = lambda ports: ",".join(f"127.0.0.1:{p}" for p in ports)  # noqa: E731
    return cluster_lib.cluster_from_flags(
        ps_hosts=hosts(job["ps_ports"]) if ps else "",
        worker_hosts=hosts(job["worker_ports"]),
        job_name=job["job_name"], task_index=job.get("task", 0))


_RUN_OPTIONS = dict(summaries=False)


def _run_kwargs(job, train_dir):
    # Nothing written during the timed steps: no periodic checkpoint, summary or log.
    return dict(train_dir=train_dir, max_steps=job["max_steps"],
                log_every_n_steps=10 ** 9, save_checkpoint_steps=10 ** 9,
                save_summaries_steps=None, examples_per_step=job["global_batch"])


def run_single(job, replies):
    import tensorflow as tf

    import towerlib
    model, values, _, images, labels = _load_model_and_data(job)
    start = time.perf_counter()
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            _initialized_from(model, values), (tf.constant(images), tf.constant(labels)),
            _optimizer(job), num_towers=job["towers"], device_type="cpu",
            update=towerlib.Replicated(), **_RUN_OPTIONS)
        stepper = Stepper(replies, {"build_seconds": time.perf_counter() - start})
        towerlib.run_training(
            train, hooks=[_stepping_hook(stepper, train.loss)],
            session_config=towerlib.session_config(job["towers"]),
            **_run_kwargs(job, job["train_dir"]))


def run_cluster_worker(job, replies, ps):
    import tensorflow as tf

    import towerlib
    from towerlib import cluster as cluster_lib
    model, values, _, images, labels = _load_model_and_data(job)
    images, labels = _worker_rows(job, images, labels)
    cluster = _cluster(job, ps)
    server = cluster_lib.start_server(cluster, job["towers"])
    start = time.perf_counter()
    with tf.Graph().as_default():
        if ps:
            placer = cluster_lib.ParameterServerPlacer(cluster)
            with tf.compat.v1.device(placer):
                global_step = tf.compat.v1.train.get_or_create_global_step()
                inputs = (tf.constant(images), tf.constant(labels))
            options = dict(device_function=placer, global_step=global_step)
        else:
            with tf.device(f"{cluster.task_device}/device:CPU:0"):
                inputs = (tf.constant(images), tf.constant(labels))
            options = dict(update=towerlib.Replicated())
        graph = cluster_lib.build_sync_train_graph(
            _initialized_from(model, values), inputs, _optimizer(job), cluster,
            num_towers=job["towers"], device_type="cpu", **options, **_RUN_OPTIONS)
        stepper = Stepper(replies, {"build_seconds": time.perf_counter() - start})
        cluster_lib.run_distributed_training(
            graph, server, hooks=[_stepping_hook(stepper, graph.train_graph.loss)],
            startup_timeout_secs=job["startup_timeout_secs"],
            step_deadline_secs=job["step_deadline_secs"],
            **_run_kwargs(job, job["train_dir"]))


def run_allreduce_plain(job, replies):
    """The all-reduce worker's graph, run by a plain session.run loop (as mwms is)."""
    import tensorflow as tf

    import towerlib
    from towerlib import cluster as cluster_lib
    model, values, _, images, labels = _load_model_and_data(job)
    images, labels = _worker_rows(job, images, labels)
    cluster = _cluster(job, ps=False)
    server = cluster_lib.start_server(cluster, job["towers"])
    start = time.perf_counter()
    with tf.Graph().as_default():
        with tf.device(f"{cluster.task_device}/device:CPU:0"):
            inputs = (tf.constant(images), tf.constant(labels))
        graph = cluster_lib.build_sync_train_graph(
            _initialized_from(model, values), inputs, _optimizer(job), cluster,
            num_towers=job["towers"], device_type="cpu", update=towerlib.Replicated(),
            **_RUN_OPTIONS)
        train = graph.train_graph
        build_seconds = time.perf_counter() - start
        config = tf.compat.v1.ConfigProto()
        config.CopyFrom(towerlib.session_config(job["towers"]))
        config.operation_timeout_in_ms = int(job["step_deadline_secs"] * 1000)
        with tf.compat.v1.Session(server.target, config=config) as session:
            train.initialize(session, timeout_secs=job["startup_timeout_secs"])
            stepper = Stepper(replies, {"build_seconds": build_seconds})
            for _ in range(job["max_steps"]):
                stepper.before_step()
                _, loss = session.run([train.train_op, train.loss])
                stepper.after_step(loss)
            stepper.end()


def run_ps(job):
    from towerlib import cluster as cluster_lib
    cluster = _cluster(job, ps=True)
    cluster_lib.run_parameter_server(cluster, timeout_secs=job["ps_timeout_secs"])


def build_mwms_step(strategy, model, values, trainable_names, images, labels, global_batch,
                    learning_rate):
    """The MultiWorkerMirroredStrategy graph: (train_op, this worker's part of the loss).

    Each replica reads its rows of the global batch (replica i of R: rows
    [i B/R, (i+1) B/R)), computes its tower's mean loss, and optimizes
    loss * n_i / B + regularization / R: TF 1 optimizers under the strategy
    SUM the replicas' gradients, so this is what makes the update the one of
    the mean loss over the global batch (plus the regularization once).
    The loss returned is sum over this worker's replicas of loss_i * n_i / B,
    without regularization: adding it over the workers gives the global mean.
    """
    import tensorflow as tf

    import towerlib
    from bench.models import tower_loss

    num_replicas = strategy.num_replicas_in_sync
    if global_batch % num_replicas:
        raise ValueError(f"The global batch {global_batch} does not split evenly over "
                         f"{num_replicas} MultiWorkerMirroredStrategy replicas.")
    per_replica = global_batch // num_replicas
    trainable = set(trainable_names)
    with strategy.scope():
        variables = {}
        for name, value in sorted(values.items()):
            if name in trainable:
                variables[name] = tf.Variable(value, name=name, trainable=True)
            else:  # moving statistics: a copy per replica, averaged when read (as Keras)
                variables[name] = tf.Variable(
                    value, name=name, trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.MEAN)
        optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, 0.9)
    trainable_vars = [variables[name] for name in sorted(trainable)]
    all_images, all_labels = tf.constant(images), tf.constant(labels)

    def replica_step():
        context = tf.distribute.get_replica_context()
        first = context.replica_id_in_sync_group * per_replica
        batch = (all_images[first:first + per_replica], all_labels[first:first + per_replica])
        regularization = []

        def strategy_variables(getter, name, *args, **kwargs):
            del getter, args
            regularizer = kwargs.get("regularizer")
            if regularizer is not None:
                regularization.append(regularizer(variables[name]))
            return variables[name]

        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                         custom_getter=strategy_variables):
            update_ops_before = set(tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.UPDATE_OPS))
            loss = tower_loss(model.tower_fn(batch,
                                             towerlib.TowerContext.single(is_training=True)))
            update_ops = [op for op in tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.UPDATE_OPS) if op not in update_ops_before]
        share = loss * (per_replica / global_batch)
        objective = share
        if regularization:
            objective += tf.add_n(regularization) / num_replicas
        grads_and_vars = optimizer.compute_gradients(objective, var_list=trainable_vars)
        with tf.control_dependencies(update_ops):
            train_op = optimizer.apply_gradients(grads_and_vars)
        return train_op, share

    train_ops, shares = strategy.extended.call_for_each_replica(replica_step)
    train_op = strategy.group(train_ops)
    local_loss = tf.add_n(list(strategy.experimental_local_results(shares)))
    return train_op, local_loss


def run_mwms(job, replies):
    import tensorflow as tf

    model, values, trainable, images, labels = _load_model_and_data(job)
    cluster_spec = tf.train.ClusterSpec(
        {"worker": [f"127.0.0.1:{p}" for p in job["worker_ports"]]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec, task_type="worker", task_id=job["task"], rpc_layer="grpc")
    start = time.perf_counter()
    with tf.Graph().as_default():
        # Made in graph mode: made eagerly, the strategy would start its own server
        # in the eager context (on this port) instead of leaving it to us.
        strategy = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver)
        config = strategy.update_config_proto(tf.compat.v1.ConfigProto())
        server = tf.distribute.Server(cluster_spec, job_name="worker",
                                      task_index=job["task"], config=config,
                                      protocol="grpc", start=True)
        train_op, local_loss = build_mwms_step(strategy, model, values, trainable, images,
                                               labels, job["global_batch"],
                                               job["learning_rate"])
        init = tf.compat.v1.global_variables_initializer()
        local_init = tf.compat.v1.local_variables_initializer()
        build_seconds = time.perf_counter() - start
        run_config = tf.compat.v1.ConfigProto()
        run_config.CopyFrom(config)
        run_config.operation_timeout_in_ms = int(job["step_deadline_secs"] * 1000)
        with tf.compat.v1.Session(server.target, config=run_config) as session:
            session.run(init)  # every worker: the initial values are broadcast from 0
            session.run(local_init)
            stepper = Stepper(replies, {"build_seconds": build_seconds,
                                        "replicas": strategy.num_replicas_in_sync})
            for _ in range(job["max_steps"]):
                stepper.before_step()
                _, loss = session.run([train_op, local_loss])
                stepper.after_step(loss)
            stepper.end()


def main(argv):
    replies = _protocol_stream()
    job = json.loads(argv[1])
    role = job["role"]
    try:
        if role == "single":
            run_single(job, replies)
        elif role in ("allreduce", "ps_worker"):
            run_cluster_worker(job, replies, ps=role == "ps_worker")
        elif role == "allreduce_flat":
            from towerlib.exchange import transport_rules  # the flat group, for comparison
            transport_rules.hubs_per_worker = lambda *args: False
            run_cluster_worker(job, replies, ps=False)
        elif role == "allreduce_plain":
            run_allreduce_plain(job, replies)
        elif role == "ps":
            run_ps(job)
        elif role == "mwms":
            run_mwms(job, replies)
        else:
            raise ValueError(f"Unknown role {role!r}; one of {ROLES}")
    except Exception as error:  # reported to the coordinator, which stops everything
        traceback.print_exc()
        replies.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
        replies.flush()
        return 1
    replies.write(json.dumps({"exited": True}) + "\n")
    replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
