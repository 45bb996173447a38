"""Where a script's run goes when --train_dir is not given.

Not one fixed folder under /tmp: that is shared by every user of the machine and every
clone of the repository, so a second clone (or user) would find the first one's finished
run and report it as its own result, or fail to write into another user's folder. The
default is ``<cache>/towerlib/cifar10/<job>-<user>-<hash of this clone's path>``, where
<cache> is $XDG_CACHE_HOME or ~/.cache (the system's temporary folder when there is no
home directory).
"""

import getpass
import hashlib
import os
import tempfile

_CLONE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        return "uid%d" % os.getuid()


def _cache_root() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if cache.startswith("~"):  # no home directory
        cache = tempfile.gettempdir()
    return cache


def default_train_dir(job: str) -> str:
    """The default --train_dir of ``job`` ('train', 'main') for this user and clone."""
    clone = hashlib.sha256(_CLONE.encode("utf-8")).hexdigest()[:10]
    return os.path.join(
        _cache_root(), "towerlib", "cifar10", "%s-%s-%s" % (job, _user(), clone)
    )
