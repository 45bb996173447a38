"""Who can reach a job's servers: every host by default, or nobody outside (one host).

TensorFlow's gRPC server binds `0.0.0.0:<port>` whatever address the cluster
names, and has no authentication: a launched job's ports are open to every
host that can reach this one. `exposure_note` is the launcher's one line saying
so. `enter_private_network` moves the launcher, before it starts anything,
into a new network namespace that has only loopback (Linux: unshare with
CLONE_NEWNET, inside a new user namespace when not root); the tasks it starts
inherit it, so they reach each other on 127.0.0.1 and nothing outside reaches
them. The cost: no outside network for the tasks (no downloads, no remote
file systems, no other machine), and not this host's own services either: the
namespace's 127.0.0.1 is its own, so a database or a server listening on the
host's loopback is not there.
"""

import ctypes
import errno
import fcntl
import os
import socket
import struct
import threading

__all__ = ["PrivateNetworkError", "enter_private_network", "exposure_note",
           "interface_names"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP = 0x1
_SECURITY = "docs/distributed.md, 'Security'"


class PrivateNetworkError(OSError):
    """This system does not let the launcher make a private network namespace."""


def exposure_note(plan):
    """The one line saying which of the job's ports other hosts can reach."""
    if plan.multi_host:
        ports = plan.fixed_ports()
        return (f"note: the tasks' TensorFlow servers listen on every interface of this "
                f"host (ports {ports[0]}-{ports[-1]}), with no authentication: let only "
                f"the job's hosts reach them (a trusted network or a firewall; {_SECURITY}).")
    return ("note: the tasks' TensorFlow servers listen on every interface (the ports of "
            "the cluster line below), with no authentication, so other hosts can reach "
            "them; --private_network keeps a one-host job on loopback only "
            f"({_SECURITY}).")


def interface_names():
    """The network interfaces this process sees, e.g. ['lo', 'eth0']."""
    return [name for _, name in socket.if_nameindex()]


def _unshare(flags):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _map_own_ids(uid, gid):
    """Inside a new user namespace: this process keeps its own uid and gid (read
    before the unshare: unmapped, they read as the overflow id)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        handle = os.open(f"/proc/self/{name}", os.O_WRONLY)   # no O_CREAT: refused there
        try:
            os.write(handle, text.encode("ascii"))
        finally:
            os.close(handle)


def _unshare_network(user_namespace):
    """The unshare itself (enter_private_network); raises OSError, changing nothing."""
    if threading.active_count() > 1:
        raise OSError(errno.EINVAL, "the launcher already runs threads")
    uid, gid = os.geteuid(), os.getegid()
    _unshare(_CLONE_NEWNET | (_CLONE_NEWUSER if user_namespace else 0))
    if user_namespace:
        _map_own_ids(uid, gid)
    _loopback_up()


def _loopback_up():
    """Brings up 'lo', which a new network namespace starts with, down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def enter_private_network(user_namespace=None):
    """Moves this process into a new network namespace with loopback only (module text).

    Call it before any thread or task starts (a user namespace needs a process
    of one thread). user_namespace: None chooses (root first tries without a user
    namespace, then, refused (no CAP_SYS_ADMIN: a container's root), with one;
    anyone else uses one); True forces one, False forbids it.

    Raises:
      PrivateNetworkError: one line naming why not (no Linux namespaces, user
        namespaces disabled, a sandbox that forbids them) and the fix.
    """
    tries = [user_namespace] if user_namespace is not None else \
        [False, True] if os.geteuid() == 0 else [True]
    reasons = []
    for with_user_namespace in tries:
        try:
            _unshare_network(with_user_namespace)
            break
        except (OSError, AttributeError) as error:   # AttributeError: no unshare in libc
            reason = getattr(error, "strerror", None) or str(error)
            reasons.append(f"{reason} {'with' if with_user_namespace else 'without'} "
                           "a user namespace")
    else:
        raise PrivateNetworkError(
            f"--private_network: this system does not let the launcher make a network "
            f"namespace ({'; '.join(reasons)}: user namespaces may be off (sysctl "
            "kernel.unprivileged_userns_clone, user.max_user_namespaces) or forbidden by a "
            "container's seccomp profile). Fix: run without it, behind a firewall "
            f"({_SECURITY})") from None
    if interface_names() != ["lo"]:
        raise PrivateNetworkError(
            f"--private_network: the new network namespace has interfaces "
            f"{interface_names()}, not loopback alone; nothing was started")
