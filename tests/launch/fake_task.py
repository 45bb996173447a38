"""A task without TensorFlow, for the launcher's fast tests: it does what its flags say.

    python fake_task.py --record DIR [--bind] [--grandchild] [--lines N]
        [--fail worker:1:0:137 ...] [--sleep SECS] [--ignore_term]

--record DIR writes DIR/<job>-<index>-<restart>.json: its pid, TF_CONFIG and the
pid of its grandchild (a `sleep` in its process group, with --grandchild).
--fail JOB:INDEX:RESTART:STATUS exits with STATUS as that task on that restart
(TOWERLIB_LAUNCH_RESTART); STATUS 137 or 143 kills itself by that signal. It
fails only once every task of its TF_CONFIG has recorded and printed what its
flags say on this restart (DIR/<job>-<index>-<restart>.ready; at most 10 s), so
what a test reads of the other tasks does not race the launcher's stop.
--steps N: prints N lines of towerlib's progress line ('step i, loss = ...') first.
--stop_secs S: SIGINT or SIGTERM is written to DIR/<job>-<index>-signals.txt, and
S seconds later the task exits 128 + the first signal (a clean stop that saves).
--bind listens on its own TF_CONFIG address as TensorFlow's server does
(SO_REUSEPORT when TF_GRPC_REUSE_PORT=1); if it cannot, it prints the line
towerlib.cluster.exit_by_meaning prints for an AddressError and exits 2.
--probe_peers (with --bind): the record also says which cluster addresses it
reached within 10 s ("reached"). Every record names the network interfaces the
task sees ("interfaces").
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def bind_own_port(config):
    address = config["cluster"][config["task"]["type"]][config["task"]["index"]]
    port = int(address.rpartition(":")[2])
    sock = socket.socket()
    if os.environ.get("TF_GRPC_REUSE_PORT") == "1":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError as error:
        print(f"error: task: AddressError: cannot listen on {address}: {error} "
              "[exit 2, fix and rerun]", file=sys.stderr, flush=True)
        sys.exit(2)
    sock.listen(4)
    return sock


def probe(config):
    """The cluster's addresses this task could connect to (each tried for up to 10 s)."""
    reached = []
    for address in [a for job in config["cluster"].values() for a in job]:
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                reached.append(address)
                break
            except OSError:
                time.sleep(0.1)
    return reached


def wait_for_every_task(record_dir, config, restart, bound_secs=10.0):
    """Until every task of `config` wrote its .ready marker of `restart` (bounded)."""
    markers = [os.path.join(record_dir, f"{job}-{index}-{restart}.ready")
               for job, addresses in config["cluster"].items()
               for index in range(len(addresses))]
    deadline = time.monotonic() + bound_secs
    while time.monotonic() < deadline and not all(map(os.path.exists, markers)):
        time.sleep(0.02)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", required=True)
    parser.add_argument("--bind", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--fail", action="append", default=[])
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ignore_term", action="store_true")
    parser.add_argument("--stop_secs", type=float, default=None)
    parser.add_argument("--probe_peers", action="store_true")
    parser.add_argument("--steps", type=int, default=0)
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    config = json.loads(os.environ["TF_CONFIG"])
    job, index = config["task"]["type"], config["task"]["index"]
    received = []
    if args.stop_secs is not None:
        def on_signal(signum, frame):
            received.append((signum, time.monotonic()))
            with open(os.path.join(args.record, f"{job}-{index}-signals.txt"), "a") as out:
                out.write(signal.Signals(signum).name + "\n")

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    restart = os.environ.get("TOWERLIB_LAUNCH_RESTART", "?")
    held = bind_own_port(config) if args.bind else None
    record = {"pid": os.getpid(), "tf_config": config, "pgid": os.getpgid(0),
              "interfaces": [name for _, name in socket.if_nameindex()]}
    if args.probe_peers:
        record["reached"] = probe(config)
    if args.grandchild:
        record["grandchild"] = subprocess.Popen(["sleep", "300"]).pid
    name = os.path.join(args.record, f"{job}-{index}-{restart}.json")
    with open(name + ".tmp", "w") as out:
        json.dump(record, out)
    os.replace(name + ".tmp", name)
    for i in range(args.lines):
        stream = sys.stdout if i % 2 == 0 else sys.stderr
        stream.write(f"line {i} of {job} {index} " + "x" * 5000 + " end\n")
        stream.flush()
    for step in range(1, args.steps + 1):
        print(f"I1129 00:00:00.0 1 hooks.py:113] step {step}, loss = 0.5000, 0.010 "
              "sec/batch", flush=True)
    with open(os.path.join(args.record, f"{job}-{index}-{restart}.ready"), "w"):
        pass
    for rule in args.fail:
        rule_job, rule_index, rule_restart, status = rule.split(":")
        if (rule_job, int(rule_index), rule_restart) == (job, index, restart):
            wait_for_every_task(args.record, config, restart)
            print(f"{job} {index} fails with {status}", flush=True)
            if int(status) in (137, 143):
                os.kill(os.getpid(), int(status) - 128)
                time.sleep(10)
            sys.exit(int(status))
    end = time.monotonic() + args.sleep
    while time.monotonic() < end:
        if received and time.monotonic() > received[0][1] + args.stop_secs:
            print(f"{job} {index} stopped cleanly", flush=True)
            sys.exit(128 + received[0][0])
        time.sleep(0.02)
    print(f"{job} {index} done", flush=True)
    del held


if __name__ == "__main__":
    main()
