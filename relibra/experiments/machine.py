"""The machine a run used: software versions and hardware for REPORT.md, and a short label for
'measured (...)' figures."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata

from relibra.experiments.config import project_root


def usable_cpus() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def environment() -> dict:
    """The software and hardware a run used: versions, CPU count, GPU if any."""
    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        **{pkg: version(pkg) for pkg in ("relibra", "torch", "megatron-core", "numpy", "pandas", "scipy", "seaborn",
                                         "papermill")},
        "executable": sys.executable,
        "load_average_1min": round(os.getloadavg()[0], 2),  # other work inflates every measured time
    }
    try:  # the kit's revision, when run from a git checkout (read-only)
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=project_root(), capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=project_root(), capture_output=True, text=True,
                               timeout=5)
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
