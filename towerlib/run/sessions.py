"""The sessions run_training creates: the chief's restore, and a bounded recreation.

MonitoredSession creates a new session whenever a step (or a session's
creation) fails with an AbortedError or UnavailableError, e.g. when a ps task
restarted and lost the variables. Unbounded, a fault that every session
meets again (a graph that does not fit what it restores) recreates sessions
forever. `BoundedSessionCreator` allows `MAX_SESSION_RECREATIONS` in a row,
within `SESSION_RECREATION_SECS`, without a step completing in between, then
raises SessionRecreationError; a stop signal received meanwhile ends the run
(towerlib.run.stopping.StopSignalReceived) instead of being held until a step
that never comes.
"""

import contextlib
import logging
import time

import tensorflow as tf

from towerlib.run import checkpoint_fit, checkpoints

logger = logging.getLogger("towerlib")

MAX_SESSION_RECREATIONS = 10
SESSION_RECREATION_SECS = 1800.0

__all__ = ["BoundedSessionCreator", "ChiefSessionCreator", "MAX_SESSION_RECREATIONS",
           "SESSION_RECREATION_SECS", "SessionRecreationError"]


class SessionRecreationError(RuntimeError):
    """Sessions were recreated too often, or too long, without completing a step."""


class ChiefSessionCreator(tf.compat.v1.train.SessionCreator):
    """The chief's sessions, each restoring the newest checkpoint there is then.

    Stock, a recreated session restores the checkpoint chosen when the
    process started (or initializes afresh): training rolls back. The first
    session restores `restore_from`; every later one asks
    `checkpoints.prepare_restore` again. Each checkpoint is checked to fit
    the graph first (towerlib.run.checkpoint_fit).
    """

    def __init__(self, scaffold, master, session_config, train_dir, restore_from,
                 partial=None):
        self._options = dict(master=master, config=session_config)
        self._scaffold = scaffold
        self._train_dir = train_dir
        self._restore_from = restore_from
        self._partial = partial  # a checkpoint_fit.PartialRestore of restore_from, or None
        self._sessions_created = 0

    def create_session(self):
        if self._sessions_created:
            logger.warning("The chief's session is being recreated (a ps task "
                           "restarted?): restoring the newest checkpoint in %s.",
                           self._train_dir)
            newest = checkpoints.prepare_restore(self._train_dir)
            if self._partial is None or newest is not None:
                self._restore_from, self._partial = newest, None
            if self._partial is None:
                checkpoint_fit.check_fits_graph(self._restore_from, self._scaffold.saver)
        self._sessions_created += 1
        if self._partial is not None:
            return self._partial_restore_session()
        return tf.compat.v1.train.ChiefSessionCreator(
            scaffold=self._scaffold, checkpoint_filename_with_path=self._restore_from,
            **self._options).create_session()

    def _partial_restore_session(self):
        """Initialized afresh, then every value the checkpoint has restored (the new
        slots keep their initial values); the copies' local init runs after."""
        partial = self._partial

        def restore(scaffold, session):
            del scaffold
            partial.saver.restore(session, partial.prefix)
            if partial.after_restore is not None:
                session.run(partial.after_restore)

        self._scaffold.finalize()
        scaffold = tf.compat.v1.train.Scaffold(copy_from_scaffold=self._scaffold,
                                               init_fn=restore)
        return tf.compat.v1.train.ChiefSessionCreator(
            scaffold=scaffold, checkpoint_filename_with_path=None,
            **self._options).create_session()


class BoundedSessionCreator(tf.compat.v1.train.SessionCreator):
    """Wraps a SessionCreator: recreations bounded, a stop signal honoured at once.

    Add `progress_hook` to the MonitoredSession's hooks: a step that completes
    resets the count and the clock.
    """

    def __init__(self, creator, signal_hook=None):
        self._creator = creator
        self._signal_hook = signal_hook
        self._created = False
        self._recreations = 0
        self._since = None
        self.progress_hook = _ProgressHook(self)

    def step_completed(self):
        self._recreations, self._since = 0, None

    def _count_recreation(self):
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        elapsed = now - self._since
        limit, secs = MAX_SESSION_RECREATIONS, SESSION_RECREATION_SECS
        if self._recreations >= limit or elapsed > secs:
            raise SessionRecreationError(
                f"The session was recreated {self._recreations} times in {elapsed:.0f} s "
                f"without completing a step (the bound: {limit} times within {secs:g} s): "
                "every step or session failed with an AbortedError or UnavailableError "
                "(see the errors logged above). Fix: bring back the ps task or worker "
                "that is gone, or restart training from a checkpoint that fits the graph.")
        self._recreations += 1

    def create_session(self):
        if self._created:
            self._count_recreation()
        self._created = True
        hook = self._signal_hook
        with hook.stop_at_once() if hook is not None else contextlib.nullcontext():
            return self._creator.create_session()


class _ProgressHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, creator):
        self._creator = creator

    def after_run(self, run_context, run_values):
        self._creator.step_completed()
