"""The machine a run used: software versions and hardware for REPORT.md, and a short label for
'measured (...)' figures."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata

from relibra.errors import ConfigError
from relibra.paths import project_root


def usable_cpus() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    """The software and hardware a run used: versions, CPU count, GPU if any."""
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        **{pkg: _version(pkg) for pkg in ("relibra", "torch", "megatron-core", "numpy", "pandas", "scipy",
                                          "seaborn", "papermill")},
        "executable": sys.executable,
        "load_average_1min": round(os.getloadavg()[0], 2),  # other work inflates every measured time
    }
    try:  # the kit's revision, when run from a git checkout (read-only)
        rev, dirty = (subprocess.run(["git", *args], cwd=project_root(), capture_output=True, text=True, timeout=5)
                      for args in (["rev-parse", "--short", "HEAD"], ["status", "--porcelain"]))
        if rev.returncode == 0:
            env["git_commit"] = rev.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch  # heavy: imported only when a run records its environment

        env["cuda_available"] = bool(torch.cuda.is_available())
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        env["torch_threads"] = torch.get_num_threads()
    except Exception:  # torch missing or broken: report, do not fail the report
        env["cuda_available"] = False
        env["gpu"] = "unknown"
    return env


def this_machine() -> str:
    """A short description of the CPU this code runs on, for 'measured (...)' labels."""
    proc = platform.processor() or platform.machine()
    # Wall-clock figures on a shared machine depend on what else runs: give the load with them.
    return f"this machine: {usable_cpus()} CPU cores ({proc}), 1 planner thread, load average {os.getloadavg()[0]:.1f}"


@dataclass(frozen=True)
class QuietCheck:
    """What the machine was doing before a measured run (quiet_machine): the 1-minute load average when the
    check began and when the run started, the cores, the seconds waited, and a warning ("" when quiet)."""

    load_at_check: float
    load_at_start: float
    cores: int
    waited_s: float
    max_wait_s: float
    warning: str = ""

    @property
    def busy(self) -> bool:
        return bool(self.warning)


def quiet_machine(max_wait_s: float, poll_s: float = 5.0, cores: int | None = None, load=None,
                  sleep=time.sleep, clock=time.monotonic, say=None) -> QuietCheck:
    """Before a measured run: wait while the 1-minute load average is above the usable cores, at most
    `max_wait_s` seconds (polling every `poll_s`), then go on either way, with a warning when still busy. load,
    sleep, clock: os.getloadavg's 1-minute figure, time.sleep and time.monotonic unless a test passes its own;
    say(text): told once when the wait begins."""
    if max_wait_s < 0 or poll_s <= 0:
        raise ConfigError(f"quiet_machine: max_wait_s must be >= 0 and poll_s > 0, got {max_wait_s}, {poll_s}")
    read = load or (lambda: os.getloadavg()[0])
    cores = cores or usable_cpus()
    first = now = float(read())
    start = clock()
    if now > cores and max_wait_s > 0 and say is not None:
        say(f"the machine is busy (1-minute load average {now:.1f} on {cores} cores): waiting up to "
            f"{max_wait_s:g} s for it to fall before measuring")
    while now > cores and clock() - start < max_wait_s:
        sleep(min(poll_s, max(0.0, max_wait_s - (clock() - start))))
        now = float(read())
    waited = clock() - start
    warning = "" if now <= cores else (
        f"measured on a busy machine: 1-minute load average {now:.1f} on {cores} usable cores (above 1 per core) "
        f"after waiting {waited:.0f} s (at most {max_wait_s:g} s) for it to fall; other work inflates every "
        "measured time, so the timings and their ratios are less reliable than on an idle machine")
    return QuietCheck(round(first, 2), round(now, 2), cores, round(waited, 1), float(max_wait_s), warning)
