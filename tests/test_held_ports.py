"""tests/distributed_processes.held_ports: a port is held from the test's choice until
the test ends, and a cluster process the test starts still binds it."""

import sys

from tests import distributed_processes
from tests.distributed_processes import ProcessGroup, held_ports, port_is_free

# TensorFlow's own server: it shares the port only when TF_GRPC_REUSE_PORT=1.
SERVE = ("import sys, tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
         "{'worker': ['127.0.0.1:' + sys.argv[1]]}), job_name='worker', task_index=0, "
         "start=True); print('bound', flush=True)")


def test_a_held_port_is_nobody_elses_until_released():
    (port,) = held_ports(1)
    assert not port_is_free(port)   # another test's process cannot take it
    distributed_processes.release_held_ports()
    assert port_is_free(port)


def test_a_tensorflow_server_the_group_starts_binds_a_held_port(tmp_path):
    (port,) = held_ports(1)
    group = ProcessGroup(tmp_path, 60, command=(sys.executable, "-c", SERVE))
    try:
        group.start("server", [str(port)])
        assert group.wait("server", 50) == 0, group.describe("server")
        assert "bound" in group.log_text("server")
    finally:
        group.close()
