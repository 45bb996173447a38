"""Ports the launcher holds: no other process can take them, the task's server can."""

import errno
import socket

import pytest

from towerlib.launch import ports


def third_party_bind(port, address="127.0.0.1", reuse_address=False):
    sock = socket.socket()
    if reuse_address:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    finally:
        sock.close()


def test_held_ports_are_distinct_and_nobody_else_can_bind_them():
    with ports.hold_free_ports(3) as held:
        assert len(set(held.ports)) == 3
        for port in held.ports:
            for address in ("127.0.0.1", "0.0.0.0"):
                for reuse_address in (False, True):
                    with pytest.raises(OSError) as raised:
                        third_party_bind(port, address, reuse_address)
                    assert raised.value.errno == errno.EADDRINUSE
    for port in held.ports:   # released: free again
        third_party_bind(port)


def test_the_tasks_server_binds_a_held_port_and_gets_its_connections():
    """As TensorFlow's gRPC server does with TF_GRPC_REUSE_PORT=1 (SO_REUSEPORT)."""
    with ports.hold_free_ports(1) as held:
        (port,) = held.ports
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        server.bind(("0.0.0.0", port))
        server.listen(1)
        server.settimeout(5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = server.accept()
            client.sendall(b"hi")
            assert accepted.recv(2) == b"hi"
            accepted.close()
        server.close()


def test_check_free_names_a_taken_fixed_port():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ports.PortTakenError, match=f"port {port} \\(--port_base\\) is "
                                                       "taken on this host.*Fix: stop") as taken_error:
            ports.check_free([port], "--port_base")
        assert str(taken_error.value).startswith("port ")  # no stray '[Errno 98]'
        assert taken_error.value.errno == errno.EADDRINUSE
    finally:
        taken.close()
    ports.check_free([port], "--port_base")
