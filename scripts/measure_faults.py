"""How long each runtime fault takes to end a real `relibra run` (2 ranks, tiny model), and what it leaves.

    .venv/bin/python scripts/measure_faults.py [--timeout 5] [--repeats 1]

Cases: rank 1 or rank 0 stopped with SIGSTOP mid-training (the survivors wait in an all-to-all); the
launcher ended with SIGTERM, SIGHUP or SIGKILL. Each line: the case, seconds from the fault to the
launcher's exit and to the last rank's exit, the launcher's last stderr line, and whether any rank
or the run's temporary folder was left. Also prints the inet listeners of one run (`ss -ltnp`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil

RUN = [sys.executable, "-m", "relibra", "run", "--nproc", "2", "--model", "tiny", "--policies", "megatron",
       "--steps", "3000", "--warmup-steps", "0", "--micro-batches", "1", "--tokens-per-rank", "16"]


def _start(timeout_s: float, temp: str):
    env = {**os.environ, "TMPDIR": temp, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*RUN, "--collective-timeout", str(timeout_s)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    launcher = psutil.Process(proc.pid)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # training has started once both ranks have a heartbeat file
        ranks = [c for c in launcher.children() if "spawn_main" in " ".join(c.cmdline())]  # not the resource tracker
        beats = [f for d in os.listdir(temp) if d.startswith("relibra-run-")
                 for f in os.listdir(os.path.join(temp, d)) if f.startswith("heartbeat")]
        if len(ranks) == 2 and len(beats) == 2:
            time.sleep(2.0)  # a few steps in
            return proc, ranks
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the run did not start within 180 s")


def _case(name: str, timeout_s: float) -> str:
    temp = tempfile.mkdtemp(prefix="relibra-faults-")
    try:
        proc, ranks = _start(timeout_s, temp)
        pids = {r.pid for r in ranks}
        if name.startswith("stop rank"):
            target = sorted(ranks, key=lambda p: p.pid)[int(name[-1])]  # spawn order: rank 0 first
            os.kill(target.pid, signal.SIGSTOP)
        else:
            proc.send_signal(getattr(signal, name.split()[-1]))
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=timeout_s + 60)
        launcher_s = time.monotonic() - t0
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            if time.monotonic() - t0 > 30:
                break
            time.sleep(0.02)
        ranks_s = time.monotonic() - t0
        time.sleep(0.5)
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        for p in left:
            os.kill(p, signal.SIGKILL)
        last = (err.replace("\r", "\n").strip().splitlines() or ["(nothing)"])[-1]
        return (f"{name:16s} launcher exit {launcher_s:6.2f} s  ranks gone {ranks_s:6.2f} s  rc {proc.returncode:4d}  "
                f"ranks left {len(left)}  temp left {os.listdir(temp)}  | {last[:150]}")
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _listeners(timeout_s: float) -> str:
    temp = tempfile.mkdtemp(prefix="relibra-faults-")
    try:
        proc, ranks = _start(timeout_s, temp)
        pids = "|".join(str(p) for p in [proc.pid, *(r.pid for r in ranks)])
        out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout.splitlines()
        proc.terminate()
        proc.communicate(timeout=30)
        return "\n".join([out[0]] + [line for line in out[1:] if any(f"pid={p}," in line for p in pids.split("|"))])
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=float, default=5.0, help="--collective-timeout of every run (default 5)")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)
    print(f"relibra run, 2 ranks, tiny model, --collective-timeout {args.timeout:g}; load {os.getloadavg()[0]:.1f}")
    for _ in range(args.repeats):
        for name in ("stop rank 1", "stop rank 0", "launcher SIGTERM", "launcher SIGHUP", "launcher SIGKILL"):
            print(_case(name, args.timeout), flush=True)
    print("inet listeners of a run's processes (ss -ltnp):")
    print(_listeners(args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
