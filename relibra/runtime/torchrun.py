"""torchrun with the kit's one-line failures: `python -m relibra.runtime.torchrun [torchrun's arguments]`.

It takes torchrun's own arguments and runs torchrun's own launcher (torch.distributed.run). What it
changes:

- How a failure ends: torchrun raises ChildFailedError and prints its traceback and a failure report
  after a rank's own `error:` line; here the agent's log lines are silenced and the failure ends as one
  line, or none where the rank has already printed its line (exit code 2, the kit's code for a clean
  error). A port already in use is one line too.
- Where its stores listen: torch's TCPStore server listens on every interface and has no
  authentication, so whoever reaches the port can read and write the rendezvous keys (and so join or
  disrupt the job). Unless the user names a host that is not this machine's loopback (--master-addr,
  --rdzv-endpoint, --local-addr, or more than one node), every store the launcher serves listens on
  127.0.0.1 only (docs/runtime.md, "torchrun").
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import signal
import socket
import sys

import torch.distributed as dist
from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

CLEAN_ERROR_EXIT = 2  # `relibra run --torchrun` exits with 2 after printing its one `error:` line
LOOPBACK = "127.0.0.1"
_LISTEN_BACKLOG = 512


class PortInUse(RuntimeError):
    """The port a store should listen on is taken."""


def is_loopback(host: str | None) -> bool:
    """Whether `host` (a name or an address; None or '' for the default) means this machine's loopback."""
    if not host:
        return True
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _endpoint_host(endpoint: str | None) -> str | None:
    """The host of a HOST[:PORT] rendezvous endpoint ('[::1]:29400' -> '::1'); None when not given."""
    if not endpoint:
        return None
    if endpoint.startswith("["):
        return endpoint[1:endpoint.index("]")] if "]" in endpoint else endpoint
    return endpoint.rsplit(":", 1)[0] if endpoint.count(":") == 1 else endpoint


def named_hosts(args) -> list[str]:
    """The hosts the user named for this job that are not loopback: --master-addr, the host of
    --rdzv-endpoint, --local-addr, and 'more than one node' for --nnodes beyond 1 (the other nodes must
    reach the store). Empty: every store may listen on loopback only."""
    named = [h for h in (getattr(args, "master_addr", None), _endpoint_host(getattr(args, "rdzv_endpoint", None)),
                         getattr(args, "local_addr", None)) if h and not is_loopback(h)]
    nnodes = str(getattr(args, "nnodes", "1"))
    if nnodes.split(":")[-1] not in ("", "1"):
        named.append(f"--nnodes {nnodes}")
    return named


class LoopbackTCPStore(dist.TCPStore):
    """A TCPStore whose server listens on 127.0.0.1 only: the launcher binds the socket itself and hands
    it over (master_listen_fd); a client is torch's own. A taken port is PortInUse."""

    def __init__(self, host_name, port, world_size=None, is_master=False, *args, **kwargs):
        if not is_master or kwargs.get("master_listen_fd") is not None:
            super().__init__(host_name, port, world_size, is_master, *args, **kwargs)
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((LOOPBACK, int(port or 0)))
            sock.listen(_LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"port {port} on {LOOPBACK} is in use (another torchrun job, or another program, "
                                f"listens there)") from None
            raise
        bound = sock.getsockname()[1]
        super().__init__(host_name, bound, world_size, is_master, *args, master_listen_fd=sock.detach(), **kwargs)


def listen_on_loopback() -> None:
    """Make every TCPStore the launcher serves a LoopbackTCPStore (the names torch's launcher and
    rendezvous modules construct their stores through)."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    dist.TCPStore = LoopbackTCPStore
    static_tcp_rendezvous.TCPStore = LoopbackTCPStore
    c10d_rendezvous_backend.TCPStore = LoopbackTCPStore


def _port_in_use(exc: BaseException) -> bool:
    """Whether torch's own error (DistNetworkError) says the listening port was taken."""
    text = str(exc)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def main(argv: list[str] | None = None) -> int:
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    args = torch_run.parse_args(argv)
    if not named_hosts(args):
        listen_on_loopback()
    try:
        torch_run.run(args)
    except PortInUse as exc:
        print(f"error: {exc}; give another --master-port (or --rdzv-endpoint), or --standalone for a free one",
              file=sys.stderr)
        return CLEAN_ERROR_EXIT
    except dist.DistNetworkError as exc:
        if _port_in_use(exc):
            print(f"error: the store's port is in use ({getattr(args, 'master_port', '?')}, or the one of "
                  f"--rdzv-endpoint); give another port, or --standalone for a free one", file=sys.stderr)
        else:
            print(f"error: torchrun's store: {str(exc).splitlines()[0][:300]}", file=sys.stderr)
        return CLEAN_ERROR_EXIT
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode == CLEAN_ERROR_EXIT:
            return CLEAN_ERROR_EXIT
        if failure.exitcode < 0:
            try:
                cause = f"killed by signal {signal.Signals(-failure.exitcode).name}"
            except ValueError:
                cause = f"killed by signal {-failure.exitcode}"
        else:
            cause = f"exited with code {failure.exitcode}"
        print(f"error: rank {rank} {cause}; torchrun stopped the other ranks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
