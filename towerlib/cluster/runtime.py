"""Running a cluster to a clean end: every task starts, trains and exits on its own.

Replicas wait for the ps tasks and for the chief's initialization, train,
then tell the ps tasks they are done; a ps task exits once every replica has
reported done (`run_parameter_server`), instead of blocking in server.join()
forever. A ps task lost during training costs a bounded wait (towerlib.cluster.recovery).
"""

import logging
import time

import tensorflow as tf

from towerlib.cluster import allreduce_job, recovery, replica_watch
from towerlib.cluster.placement import start_server
from towerlib.cluster.spec import PS_JOB, check_cluster
from towerlib.exchange.safety import PeerTimeoutError
from towerlib.run import trainer as trainer_lib

logger = logging.getLogger("towerlib")

# The queue each ps task waits on until every replica reports it is done.
_DONE_QUEUE_NAME = "towerlib_replicas_done"


def _done_queue(ps_task, capacity=1024):
    """The queue on ps task `ps_task` that replicas put their index in when done."""
    with tf.device(f"/job:{PS_JOB}/task:{ps_task}/device:CPU:0"):
        return tf.queue.FIFOQueue(capacity, [tf.int32], shapes=[[]],
                                  shared_name=f"{_DONE_QUEUE_NAME}_{ps_task}",
                                  name=f"{_DONE_QUEUE_NAME}_{ps_task}")


def wait_for_ps_tasks(cluster, timeout_secs=600.0, poll_secs=0.5):
    """Blocks until every ps task accepts TCP connections on its port.

    TensorFlow's session creation waits for unreachable tasks forever (no
    RunOptions or ConfigProto timeout reaches it), so replicas check first.

    Raises:
      PeerTimeoutError (a TimeoutError): naming the ps tasks still unreachable after timeout_secs.
    """
    def error(waiting):
        described = ", ".join(f"ps task {i} at {a}" for i, a in waiting.items())
        return PeerTimeoutError(
            f"{described} did not answer within {timeout_secs:.0f} s. Start "
            "it (--job_name=ps), or fix the ps addresses (--ps_hosts / TF_CONFIG).")

    recovery.wait_for_answers(
        lambda: recovery.unreachable_ps_tasks(cluster, max(poll_secs, 0.1)),
        timeout_secs, error, poll_secs, waiting_for="the ps tasks to start")


class ControlSession:
    """A small session of one replica beside its training session.

    Opened (and used once) before training, it waits for the chief's
    initialization and, after training, tells the ps tasks this replica is
    done. It is never opened after the training session has closed: a new
    gRPC session created right then crashed the chief once (a segfault inside
    TensorFlow). Build it before the training session finalizes the graph.
    A ps task that restarts loses the graphs registered on it, so after one
    the session is renewed (`renew`), while the training session is being
    recreated anyway.

    Args:
      cluster: this replica's ClusterInfo.
      target: its server's target.
      config: its session config (sync_graph.session_config).
    """

    def __init__(self, cluster, target, config):
        self.cluster = cluster
        with tf.name_scope("control"):
            self._uninitialized = tf.compat.v1.report_uninitialized_variables(
                tf.compat.v1.global_variables())
            with tf.control_dependencies(None):
                self._report_done = tf.group(*[
                    _done_queue(i).enqueue(cluster.replica_index)
                    for i in range(cluster.num_ps)])
                # A failed replica reports -1 - its index: the ps tasks stop too.
                self._report_failed = tf.group(*[
                    _done_queue(i).enqueue(-1 - cluster.replica_index)
                    for i in range(cluster.num_ps)])
        self._target = target
        self._config = config
        self._session = tf.compat.v1.Session(target, config=config)

    def renew(self):
        """Replaces the session by a new one (the old one's graphs died with a ps task)."""
        recovery.close_within(self._session.close)
        self._session = tf.compat.v1.Session(self._target, config=self._config)

    def uninitialized_variables(self, timeout_secs=10.0):
        """Names of the global variables nobody has initialized yet."""
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
        return self._session.run(self._uninitialized, options=options)

    def wait_for_chief(self, timeout_secs=600.0, poll_secs=0.5):
        """Blocks until the chief has initialized (or restored) every global variable.

        MonitoredTrainingSession makes a non-chief wait too, but polls every
        30 s; this polls every `poll_secs`.

        Raises:
          PeerTimeoutError (a TimeoutError): when the chief has not initialized within timeout_secs.
        """
        started = time.time()
        deadline, next_report = started + timeout_secs, started + recovery.REPORT_EVERY_SECS
        while True:
            try:
                if not len(self.uninitialized_variables()):
                    return
            except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                    tf.errors.AbortedError):
                pass
            now = time.time()
            if now > deadline:
                raise PeerTimeoutError(
                    f"The chief has not initialized the model after {timeout_secs:.0f} s. "
                    "Is the chief running, and can this task reach every ps task?")
            if now >= next_report:
                chief = self.cluster.replica_address(0)
                logger.info("Waiting %.0f s for the chief (%s at %s) to initialize the "
                            "model; %.0f s left before the timeout.", now - started,
                            chief[0], chief[1], deadline - now)
                next_report = now + recovery.REPORT_EVERY_SECS
            time.sleep(poll_secs)

    def report_done(self, timeout_secs=60.0):
        """Tells every ps task this replica has finished (see run_parameter_server)."""
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
        try:
            self._session.run(self._report_done, options=options)
        except tf.errors.OpError as error:
            logger.warning("Could not tell the ps tasks that replica %d is done (%s); "
                           "stop them by hand.", self.cluster.replica_index,
                           error.message)

    def report_failed(self, timeout_secs=10.0):
        """Tells every ps task this replica stopped on an error, so that they exit too."""
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
        try:
            self._session.run(self._report_failed, options=options)
        except tf.errors.OpError as error:
            logger.warning("Could not tell the ps tasks that replica %d failed (%s).",
                           self.cluster.replica_index, error.message)

    def close(self):
        """Closes the session, giving up after a few seconds (a dead ps hangs it)."""
        recovery.close_within(self._session.close)


def run_distributed_training(
        sync_graph, server, *, train_dir, max_steps, hooks=(), startup_timeout_secs=600.0,
        ps_restart_timeout_secs=recovery.DEFAULT_PS_RESTART_TIMEOUT_SECS,
        step_deadline_secs=replica_watch.DEFAULT_STEP_DEADLINE_SECS,
        report_done=True, **run_kwargs):
    """Runs this replica's training until global_step reaches max_steps.

    An all-reduce job (build_sync_train_graph with update=towerlib.Replicated())
    runs through towerlib.cluster.allreduce_job.run_allreduce_training; what
    follows is the parameter-server path.

    The chief initializes or restores from the latest checkpoint in train_dir,
    and alone writes checkpoints and summaries there (train_dir must be on a
    file system every ps task can write: the checkpoint is sharded per ps).
    Other replicas wait for it, then join; a restarted replica rejoins the same
    way. When training has ended normally, final checkpoint included, each
    replica tells the ps tasks it is done (`report_done`), so that
    `run_parameter_server` can return.

    A ps task that dies fails the step in flight; the replica then waits up
    to `ps_restart_timeout_secs` for it to answer again. If it does (a
    restarted ps, its variables lost), the chief restores the newest complete
    checkpoint in train_dir, the others wait for that and every replica goes
    on from there. If it does not, PsUnavailableError names the task.

    Args:
      sync_graph: from build_sync_train_graph.
      server: this task's server (start_server).
      train_dir, max_steps, hooks, **run_kwargs: as for towerlib.run_training.
      startup_timeout_secs: how long to wait for the ps tasks to answer and,
        on a non-chief, for the chief to initialize; then TimeoutError.
      ps_restart_timeout_secs: how long to wait for a ps task that stopped
        answering during training (and, on a non-chief, for the chief to
        restore the model after it came back); then PsUnavailableError
        (or TimeoutError).
      step_deadline_secs: the bound on one synchronous step (a replica waits
        for the others in it): past it ReplicaLostError, after telling the
        ps tasks to stop. A step waiting longer than 5 s is logged every 5 s.
      report_done: tell the ps tasks when done.

    Returns:
      What towerlib.run_training returns: (global_step, loss) after the last
      step this replica ran.

    Raises:
      towerlib.cluster.PsUnavailableError: a ps task was lost for longer
        than ps_restart_timeout_secs.
      towerlib.cluster.ReplicaLostError: a step waited past step_deadline_secs
        for a replica (killed, stopped or never started).
    """
    cluster = sync_graph.cluster
    if isinstance(sync_graph, allreduce_job.AllReduceTrainGraph):
        return allreduce_job.run_allreduce_training(
            sync_graph, server, train_dir=train_dir, max_steps=max_steps, hooks=hooks,
            startup_timeout_secs=startup_timeout_secs,
            step_deadline_secs=step_deadline_secs, **run_kwargs)
    if run_kwargs.get("evaluation") is not None:
        raise ValueError(
            "evaluation= runs on one machine and across all-reduce workers "
            "(update=towerlib.Replicated()); with ps tasks, evaluate in a job of its own "
            "on the chief's checkpoints in train_dir.")
    with sync_graph.train_graph.train_op.graph.as_default():
        control = ControlSession(cluster, server.target, sync_graph.session_config)
    try:
        started = time.time()
        wait_for_ps_tasks(cluster, startup_timeout_secs)
        if cluster.is_chief:
            try:
                control.uninitialized_variables()  # opens the session before training
            except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as error:
                logger.warning("The control session did not open before training "
                               "(%s); it will when reporting done.", error.message)
        else:
            control.wait_for_chief(max(startup_timeout_secs - (time.time() - started), 1.0))
        deadline = replica_watch.StepDeadlineHook(step_deadline_secs)
        try:
            result = trainer_lib.run_training(
                sync_graph.train_graph, train_dir=train_dir, max_steps=max_steps,
                hooks=list(sync_graph.hooks) + list(hooks) + [deadline],
                session_config=sync_graph.session_config, master=server.target,
                is_chief=cluster.is_chief,
                session_creator_wrapper=lambda creator: recovery.RecoveringSessionCreator(
                    creator, cluster, control, ps_restart_timeout_secs),
                **run_kwargs)
        except tf.errors.DeadlineExceededError:
            error = replica_watch.lost_replica_error(cluster, step_deadline_secs,
                                                     deadline.runs)
            control.report_failed()
            raise error from None
        if report_done:
            control.report_done()
        return result
    finally:
        control.close()


def run_parameter_server(cluster, server=None, timeout_secs=None):
    """Serves this ps task's variables until every replica reports done.

    Unlike server.join(), this returns once each of the R replicas has
    finished (run_distributed_training reports it), so the whole cluster
    exits on its own. A replica that crashes and is restarted reports once,
    when its new incarnation finishes.

    Args:
      cluster: a ps task's ClusterInfo.
      server: its started server (default: start one).
      timeout_secs: give up after this long (None: wait as long as it takes).

    Raises:
      PeerTimeoutError (a TimeoutError): when the replicas have not all finished in timeout_secs.
    """
    check_cluster(cluster, "run_parameter_server")
    if not cluster.is_ps:
        raise ValueError(f"run_parameter_server runs on a ps task, not "
                         f"{cluster.task_device}.")
    server = server or start_server(cluster)
    with tf.Graph().as_default():
        dequeue = _done_queue(cluster.task_index).dequeue()
        config = tf.compat.v1.ConfigProto(device_filters=[cluster.task_device])
        options = tf.compat.v1.RunOptions(
            timeout_in_ms=int(timeout_secs * 1000) if timeout_secs else 0)
        deadline = time.time() + timeout_secs if timeout_secs else None
        with tf.compat.v1.Session(server.target, config=config) as session:
            for done in range(1, cluster.num_replicas + 1):
                if deadline is not None:
                    remaining = deadline - time.time()
                    options.timeout_in_ms = max(1, int(remaining * 1000))
                try:
                    replica = session.run(dequeue, options=options)
                except tf.errors.DeadlineExceededError as error:
                    raise PeerTimeoutError(
                        f"ps task {cluster.task_index}: only {done - 1} of "
                        f"{cluster.num_replicas} replicas finished within "
                        f"{timeout_secs} s.") from error
                if replica < 0:
                    raise replica_watch.ReplicaLostError(
                        f"ps task {cluster.task_index}: replica {-1 - replica} stopped on "
                        "an error (see its log); this ps task exits too. Restart the "
                        "whole job with the same commands.")
                logger.info("ps task %d: replica %d done (%d of %d).",
                            cluster.task_index, replica, done, cluster.num_replicas)
    return server
