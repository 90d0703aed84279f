"""`python -m relibra.runtime.torchrun` listens on loopback only unless the user names a host, and a
port in use is one line (exit code 2), not torch's DistNetworkError traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from relibra.runtime.torchrun import LoopbackTCPStore, is_loopback, named_hosts

ROOT = Path(__file__).resolve().parents[1]


def _listening_address(port: int) -> str:
    """The local address of the socket listening on `port` (from /proc/net/tcp; state 0A = LISTEN)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":
            return socket.inet_ntoa(bytes.fromhex(addr)[::-1])
    return ""


def test_a_store_server_listens_on_loopback_only():
    store = LoopbackTCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10), multi_tenant=True)
    store.set("k", "v")
    assert _listening_address(store.port) == "127.0.0.1"
    client = LoopbackTCPStore("127.0.0.1", store.port, 1, False, timedelta(seconds=10))
    assert client.get("k") == b"v"


@pytest.mark.parametrize("argv, named", [
    (["x.py"], []),
    (["--standalone", "x.py"], []),
    (["--master-addr", "localhost", "x.py"], []),
    (["--rdzv-endpoint", "[::1]:29400", "x.py"], []),
    (["--master-addr", "10.0.0.5", "x.py"], ["10.0.0.5"]),
    (["--rdzv-endpoint", "node7:29400", "x.py"], ["node7"]),
    (["--nnodes", "2", "x.py"], ["--nnodes 2"]),
])
def test_a_host_the_user_names_keeps_torch_default(argv, named):
    from torch.distributed import run as torch_run

    assert named_hosts(torch_run.parse_args(argv)) == named
    assert is_loopback("127.0.0.2") and not is_loopback("0.0.0.0")


def test_a_port_in_use_is_one_line():
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        proc = subprocess.run([sys.executable, "-m", "relibra.runtime.torchrun", "--nproc-per-node", "2",
                               "--master-port", str(port), "-m", "relibra", "--version"], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert err == [f"error: port {port} on 127.0.0.1 is in use (another torchrun job, or another program, listens "
                   f"there); give another --master-port (or --rdzv-endpoint), or --standalone for a free one"], err
