"""Who can reach a launched job's servers: the launcher says it in one line, and
--private_network keeps a one-host job in a network namespace with loopback only."""

import errno
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.launch.tasks import FAKE_TASK, assert_none_alive, records, wait_until
from towerlib.launch import command_line, network
from towerlib.launch.plan import JobPlan


def test_the_exposure_line_names_every_interface_and_the_way_out():
    one_host = network.exposure_note(JobPlan(2))
    assert "\n" not in one_host and "every interface" in one_host
    assert "no authentication" in one_host and "--private_network" in one_host
    assert "docs/distributed.md, 'Security'" in one_host
    two_hosts = network.exposure_note(JobPlan(2, hosts=("a:7000", "b:7000"), host_index=1))
    assert "ports 7000-7001" in two_hosts and "firewall" in two_hosts


def test_private_network_with_hosts_is_one_line():
    with pytest.raises(command_line.UsageError, match="--private_network with --hosts"):
        command_line.parse_args(["--workers", "1", "--hosts", "a,b", "--host_index", "0",
                                 "--private_network", "--", "true"])


def test_a_system_without_namespaces_is_said_in_one_line(monkeypatch, capsys):
    def refused(flags):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(network, "_unshare", refused)
    # Under pytest-xdist this process runs threads of its own; the launcher does not.
    monkeypatch.setattr(network.threading, "active_count", lambda: 1)
    with pytest.raises(SystemExit) as exited:
        command_line.main(["--workers", "1", "--private_network", "--", "true"])
    assert exited.value.code == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and line.startswith(
        "towerlib-launch: error: --private_network: this system does not let the launcher "
        "make a network namespace (Operation not permitted with")
    assert "Fix: run without it" in line


@pytest.mark.slow   # a fresh Python in a new user and network namespace
@pytest.mark.parametrize("user_namespace", [True, False])
def test_the_private_network_has_loopback_only_and_it_works(user_namespace):
    code = ("import socket, sys\n"
            "from towerlib.launch import network\n"
            f"network.enter_private_network(user_namespace={user_namespace})\n"
            "server = socket.create_server(('127.0.0.1', 0))\n"
            "socket.create_connection(server.getsockname(), timeout=2).close()\n"
            "print(network.interface_names())\n")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60)
    if "does not let the launcher" in completed.stderr:
        pytest.skip(completed.stderr.strip().splitlines()[-1])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "['lo']"


@pytest.mark.slow   # a fresh Python without CAP_SYS_ADMIN
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and util-linux's setpriv to drop CAP_SYS_ADMIN")
def test_root_without_cap_sys_admin_gets_its_private_network_in_a_user_namespace():
    """A container's root: unshare(CLONE_NEWNET) alone is refused without CAP_SYS_ADMIN,
    but a new user namespace grants it there; the launcher's own choice tries both."""
    code = ("from towerlib.launch import network\n"
            "network.enter_private_network()\n"
            "print(network.interface_names())\n")
    completed = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", sys.executable, "-c", code],
                               capture_output=True, text=True, timeout=60)
    if "with a user namespace" in completed.stderr:
        pytest.skip(completed.stderr.strip().splitlines()[-1])   # none allowed here at all
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "['lo']"


@pytest.mark.slow   # the launcher and its tasks in fresh processes
def test_a_private_network_job_reaches_itself_and_nobody_else_reaches_it(tmp_path):
    """Two tasks listen on their TF_CONFIG ports and reach each other; this process,
    outside the namespace, cannot reach them; the tasks see only loopback."""
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    err = tmp_path / "err.txt"
    command = [sys.executable, "-m", "towerlib.launch", "--workers", "2", "--private_network",
               "--", sys.executable, FAKE_TASK, "--record", str(record_dir), "--bind",
               "--probe_peers", "--sleep", "20"]
    with open(err, "wb") as stderr:
        launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        found = wait_until(lambda: len(records(record_dir)) == 2 and records(record_dir),
                           60, "2 task records")
        if launcher.poll() == 2:
            pytest.skip(err.read_text().strip())
        addresses = found["worker-0-0"]["tf_config"]["cluster"]["worker"]
        for name, record in found.items():
            assert record["interfaces"] == ["lo"], (name, record)
            assert record["reached"] == addresses, (name, record)
        for address in addresses:
            port = int(address.rpartition(":")[2])
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
        launcher.send_signal(15)
        assert launcher.wait(30) == 143
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
    text = err.read_text()
    assert "private network namespace: loopback only" in text, text
    assert "every interface" not in text, text
    assert_none_alive(record_dir)


def test_the_one_host_launcher_says_its_ports_are_open(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        command_line.main(["--workers", "1", "--", sys.executable, "-c", "pass"])
    assert exited.value.code == 0
    notes = [line for line in capsys.readouterr().err.splitlines()
             if "every interface" in line]
    assert len(notes) == 1 and notes[0].startswith("[launch] note: "), notes

