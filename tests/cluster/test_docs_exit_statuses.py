"""Every exit status the docs mention is the one towerlib/cluster/exits.py gives.

A mention is 'status N', 'exit N', 'exits with status N', '[exit N' in README.md and
docs/*.md. Each must be a status exits.py defines (0, 1, USER_ERROR, RETRYABLE,
HOST_LOST, 128 + a signal); one said of an error that towerlib names in the same paragraph
(the nearest such name), or of 'restart me' / 'retryable', must be that error's
status, as exits.exit_status gives it."""

import pathlib
import re
import signal

from towerlib import cluster as cluster_lib
from towerlib.cluster import exits
from towerlib.run.checkpoints import CheckpointError

ROOT = pathlib.Path(__file__).resolve().parents[2]
MENTION = re.compile(r"(?:\bexit(?:s|ed)?(?: with)?(?: status)?|\bstatus|\[exit) +(\d+)\b")
# The errors towerlib names in its one-line failures, by the name users read.
ERRORS = {cls.__name__: cls for cls in (
    cluster_lib.WorkerLostError, cluster_lib.ReplicaLostError,
    cluster_lib.PsUnavailableError, cluster_lib.PeerTimeoutError, cluster_lib.AddressError,
    CheckpointError, ValueError, TypeError)}
ERROR_NAME = re.compile(r"\b(" + "|".join(ERRORS) + r")\b")
RETRY_WORDS = re.compile(r'"restart me"|\bretryable\b')


def defined_statuses():
    signals = {128 + int(s) for s in signal.Signals}
    return {0, 1, exits.USER_ERROR, exits.RETRYABLE, exits.HOST_LOST} | signals


def status_of(name):
    return exits.exit_status(ERRORS[name].__new__(ERRORS[name]))


def paragraphs(text):
    """Paragraphs, list items and table rows: where a status and its cause sit together."""
    return re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\d+\. |\|))", text)


def mentions(text):
    """(status, the status the docs' words give it or None, the words) of every mention."""
    found = []
    for paragraph in paragraphs(text):
        names = [(m.start(), m.group(1)) for m in ERROR_NAME.finditer(paragraph)]
        for mention in MENTION.finditer(paragraph):
            status, meant = int(mention.group(1)), None
            after = paragraph[mention.end():mention.end() + 40]
            if RETRY_WORDS.search(after):
                meant = exits.RETRYABLE
            elif names:
                _, nearest = min(names, key=lambda item: abs(item[0] - mention.start()))
                meant = status_of(nearest)
            found.append((status, meant, " ".join(paragraph[
                max(mention.start() - 80, 0):mention.end() + 60].split())))
    return found


def docs():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def test_the_docs_mention_exit_statuses():
    assert sum(len(mentions(path.read_text())) for path in docs()) >= 10


def test_every_exit_status_the_docs_mention_is_the_one_exits_gives():
    wrong = []
    for path in docs():
        for status, meant, words in mentions(path.read_text()):
            if status not in defined_statuses():
                wrong.append(f"{path.name}: {status} is no status of exits.py: {words}")
            elif meant is not None and status not in (meant, 0):
                wrong.append(f"{path.name}: says {status}, exits.py gives {meant}: {words}")
    assert wrong == []


def test_a_lost_peer_in_the_docs_words_is_caught():
    """The check itself: the old text of a lost worker's status is refused."""
    old = ("- a worker killed: the other's step fails at once, and it exits with status 2 "
           "and one line, `error: WorkerLostError: Worker 0: ...`;\n\n"
           "any supervisor that restarts a job whose process exits non-zero: status 2 "
           'means "restart me").')
    assert [(status, meant) for status, meant, _ in mentions(old)] == [(2, 138), (2, 138)]
