"""Free ports that no other process can take between the launcher's choice and the task's bind.

Choosing a port by binding port 0, closing and passing the number on leaves
a window in which another process takes it (pytorch#126510, deepspeed#1923).
Here each chosen port stays bound by the launcher, with SO_REUSEPORT and
without SO_REUSEADDR, until the attempt that uses it ends. Another process's
bind fails (with or without SO_REUSEADDR); the task's gRPC server binds and
listens beside it because TensorFlow sets SO_REUSEPORT on its server socket
when TF_GRPC_REUSE_PORT=1, which the launcher sets for every task. The held
socket never listens, so every connection reaches the task.

What this cannot stop: a process of the same user that sets SO_REUSEPORT
itself and binds that very port. A task that fails to bind anyway exits 2
with an AddressError line, and the launcher retries with new ports.
"""

import errno
import socket

__all__ = ["REUSE_PORT_VARIABLE", "HeldPorts", "PortTakenError", "check_free", "hold_free_ports"]

# TensorFlow's gRPC server sets SO_REUSEPORT when this variable is "1".
REUSE_PORT_VARIABLE = "TF_GRPC_REUSE_PORT"


class PortTakenError(OSError):
    """A port the launcher was told to use is held by another process.

    Its text is the message alone: OSError's would start '[Errno 98] ', a stray
    code before the launcher's one line (the errno stays in `.errno`).
    """

    def __str__(self):
        return self.strerror or super().__str__()


def _bound_socket(port):
    """A TCP socket bound to every address (IPv6 and IPv4 where possible) on `port`."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        sock = None
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("::", port))
            return sock
        except OSError as error:
            sock.close()
            if error.errno == errno.EADDRINUSE:
                raise
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)   # no IPv6 on this host
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        raise
    return sock


class HeldPorts:
    """Ports bound by this process until close() (a context manager).

    Attributes:
      ports: the port numbers, in the order asked for.
    """

    def __init__(self, sockets):
        self._sockets = list(sockets)
        self.ports = [sock.getsockname()[1] for sock in self._sockets]

    def close(self):
        """Releases every port (the tasks' servers keep listening on theirs)."""
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def hold_free_ports(count):
    """`count` distinct free ports, each held (see the module's text) until close()."""
    sockets = []
    try:
        for _ in range(count):
            sockets.append(_bound_socket(0))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return HeldPorts(sockets)


def check_free(ports, what):
    """Raises PortTakenError naming the first of `ports` another process holds.

    For fixed ports (a multi-host job's), which cannot be held across hosts:
    probed once, with SO_REUSEADDR as a server binds, and released at once.
    """
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("0.0.0.0", port))
        except OSError as error:
            raise PortTakenError(
                error.errno, f"port {port} ({what}) is taken on this host: "
                f"{error.strerror}. Fix: stop what holds it, or choose other ports "
                "(--port_base, or this host's name:port in --hosts, the same on every "
                "host)") from None
        finally:
            sock.close()
