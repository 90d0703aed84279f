"""The notebook runner behind `relibra reproduce`: notebooks/NN_name.py (Jupytext) run through papermill, the
executed copy and its HTML export kept beside the results (results/<nb>/<nb>.ipynb, .html); one run per output
folder (OutputLock); every -p parameter checked against the notebooks' Params before any kernel starts. It sits
above relibra.experiments, so the command line reaches the notebooks through it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from relibra.errors import ConfigError
from relibra.paths import project_root, write_text


def load_notebook(name: str):
    """notebooks/<name>.py (Jupytext py:percent) as an nbformat notebook without outputs."""
    import jupytext

    from relibra.experiments.run import notebook_source

    path = notebook_source(name)
    if not path.exists():
        raise ConfigError(f"notebook source {path} is missing")
    nb = jupytext.read(path)
    nb.metadata.pop("jupytext", None)  # the executed copy is a plain notebook, not paired
    return nb


# <script> elements that load code from a network (require.js, MathJax from a CDN): an export reads offline.
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>|"
                            r"<script\b[^>]*>(?:(?!</script>).)*?https?://cdn(?:(?!</script>).)*</script>", re.S)


def export_html(executed: Path) -> Path:
    """<executed>.html beside the executed notebook (nbconvert, figures embedded, no remote script)."""
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    html = executed.with_suffix(".html")
    write_text(html, _REMOTE_SCRIPT.sub("", body))
    return html


# The kernel managers this process started, so that an interrupt can end them and their children.
_KERNELS: list = []


def _kernel_manager():
    """A KernelManager over IPC sockets in a private temporary folder (not TCP, which ipykernel warns is
    unencrypted); it first removes the folders of reproduce processes that no longer run."""
    from jupyter_client.manager import KernelManager

    class IpcKernelManager(KernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            _KERNELS.append(self)
            self.folder = Path(tempfile.mkdtemp(prefix=f"relibra-kernel-{os.getpid()}-"))
            self.transport = "ipc"
            self.ip = str(self.folder / "kernel")
            self.connection_file = str(self.folder / "kernel.json")

        async def _async_cleanup_resources(self, restart: bool = False) -> None:  # what shutdown_kernel calls
            await super()._async_cleanup_resources(restart=restart)
            if not restart:
                shutil.rmtree(self.folder, ignore_errors=True)

    for folder in Path(tempfile.gettempdir()).glob("relibra-kernel-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    return IpcKernelManager


def _kill_kernels() -> None:
    """SIGKILL every kernel this process started with its children (jupyter_client starts a kernel in a session
    of its own: its process group is exactly the kernel and its worker pools)."""
    while _KERNELS:
        km = _KERNELS.pop()
        provisioner = getattr(km, "provisioner", None)
        process = getattr(provisioner, "process", None)
        group = getattr(provisioner, "pgid", None)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group and group != os.getpgrp():
                os.killpg(group, signal.SIGKILL)
            elif process is not None:
                process.kill()
        if process is not None:
            with contextlib.suppress(Exception):  # gone already, or not our child
                process.wait(timeout=5)
        if getattr(km, "folder", None):
            shutil.rmtree(km.folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


LOCK_NAME = ".reproduce.lock"
_HELD: dict[str, int] = {}  # output folders this process holds the lock of, and how often


class OutputLock:
    """One writer per output folder: <out>/.reproduce.lock holds the writer's pid, flock(2)ed while it runs.
    The OS drops the lock when its holder ends in any way, so a dead run's lock is taken over; a live holder
    makes a second run fail with one ConfigError naming its pid. A clean release removes the file."""

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_NAME
        self.fd: int | None = None
        self.previous_holder = ""  # pid written by a run that died holding the folder, if any

    def __enter__(self) -> "OutputLock":
        self.key = str(self.out_dir.resolve())
        if self.key in _HELD:  # this process holds it already (relibra reproduce, then run_notebooks)
            _HELD[self.key] += 1
            return self
        self.out_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise ConfigError(f"--out {self.out_dir}: another `relibra reproduce` (pid {holder}) is writing "
                                  f"there ({self.path}); wait for it to end or give another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:  # released and removed between our open and flock: try again
                same = False
            if same:
                break
            os.close(fd)
        self.previous_holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        _HELD[self.key] = 1
        return self

    def __exit__(self, *exc) -> None:
        _HELD[self.key] -= 1
        if self.fd is not None and not _HELD[self.key]:
            del _HELD[self.key]
            self.path.unlink(missing_ok=True)
            os.close(self.fd)  # releases the flock
            self.fd = None


def recover_folders(out_dir: Path) -> list[str]:
    """Put back what runs killed outright left in out_dir (call it holding its OutputLock): each .<nb>.previous
    replaces the incomplete <nb>/; each .<nb>.running.ipynb is removed. Returns the notebooks put back."""
    restored = []
    for previous in sorted(out_dir.glob(".*.previous")):
        if previous.is_dir():
            nb_out = out_dir / previous.name[1:-len(".previous")]
            had_results = any(previous.iterdir())
            _restore_notebook_folder(nb_out, previous)
            if had_results:
                restored.append(nb_out.name)
    for running in out_dir.glob(".*.running.ipynb"):
        running.unlink(missing_ok=True)
    return restored


def _start_notebook_folder(nb_out: Path) -> Path:
    """Make `nb_out` empty for a new run, its content moved aside to .<name>.previous (returned; empty when there
    was none). A .previous left by a killed run is put back first."""
    previous = nb_out.with_name(f".{nb_out.name}.previous")
    if previous.exists():
        _restore_notebook_folder(nb_out, previous)
    if nb_out.exists():
        nb_out.rename(previous)
    else:
        previous.mkdir(parents=True)
    nb_out.mkdir()
    return previous


def _restore_notebook_folder(nb_out: Path, previous: Path) -> None:
    """Discard `nb_out`; put the previous folder back (or none, when there was none)."""
    shutil.rmtree(nb_out, ignore_errors=True)
    if any(previous.iterdir()):
        previous.rename(nb_out)
    else:
        previous.rmdir()


def _end_notebook_folder(nb_out: Path, previous: Path, finished: bool) -> Path:
    """A finished run's folder replaces the previous one; an unfinished one moves to <name>.failed and the
    previous folder comes back. Returns where the run is."""
    if finished:
        shutil.rmtree(previous, ignore_errors=True)
        return nb_out
    failed = nb_out.with_name(f"{nb_out.name}.failed")
    shutil.rmtree(failed, ignore_errors=True)
    nb_out.rename(failed)
    _restore_notebook_folder(nb_out, previous)
    return failed


def _execute(execute, name: str) -> None:
    """execute() (papermill) in a thread. In the main thread nbclient installs SIGINT and SIGTERM handlers that
    only ask the kernel to shut down and keep waiting on the running cell; in a thread it installs none, so
    both reach this thread at once and end the kernel and its children first. A kernel that ended and that
    papermill has not noticed within KERNEL_DEATH_GRACE_S is a KernelDied."""
    failure: list[BaseException] = []

    def target():
        try:
            execute()
        except BaseException as exc:  # handed to the main thread
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"papermill {name}", daemon=True)
    thread.start()
    dead_since = None
    try:
        while thread.is_alive():
            thread.join(0.2)
            ended = _ended_kernel()
            if ended is None:
                continue
            dead_since = dead_since or time.monotonic()
            if time.monotonic() - dead_since > KERNEL_DEATH_GRACE_S:
                _kill_kernels()
                raise KernelDied(f"the kernel {ended} while notebook {name} ran")
    except BaseException:
        _kill_kernels()
        thread.join(5)  # papermill sees the dead kernel and stops writing
        raise
    if failure:
        raise failure[0]


KERNEL_DEATH_GRACE_S = 3.0


class KernelDied(RuntimeError):
    """A notebook's kernel ended (killed, out of memory) and papermill kept waiting for its reply."""


def _ended_kernel() -> str | None:
    """How the first ended kernel of this process ended ('was killed by SIGKILL', 'exited with code 1'), or
    None while all run."""
    for km in list(_KERNELS):
        process = getattr(getattr(km, "provisioner", None), "process", None)
        code = process.poll() if process is not None else None
        if code is None:
            continue
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"
    return None


def select_notebooks(names: list[str] | None) -> list[str]:
    """Full notebook names from names, numbers or suffixes ('02', '02_throughput', 'throughput')."""
    from relibra.experiments import NOTEBOOKS

    if not names:
        return list(NOTEBOOKS)
    chosen = []
    for raw in names:
        name = Path(raw).stem  # accept notebooks/02_throughput.ipynb too
        hits = [n for n in NOTEBOOKS if n == name or n.split("_", 1)[0] == name or n.split("_", 1)[1] == name]
        if len(hits) != 1:
            raise ConfigError(f"unknown notebook {raw!r}; known: {', '.join(NOTEBOOKS)} (or their numbers)")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


def run_notebooks(names: list[str], profile: str, out_dir: str | os.PathLike, seed: int = 0,
                  measured_dir: str | None = None, extra_parameters: dict | None = None,
                  progress: bool = True, html: bool = True) -> dict[str, dict]:
    """Execute each notebook with papermill; returns {notebook: {status, wall_seconds, error}}.

    Each gets out_dir, profile, seed and measured_dir where it declares them, and `extra_parameters`. A failing
    notebook is recorded and the others still run. <out_dir>/<nb>/ is replaced only by a run that finished: a
    failed one goes to <out_dir>/<nb>.failed/, an interrupted one leaves the previous folder.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    from relibra.experiments import get_profile
    from relibra.progress import ENV, progress as tqdm

    get_profile(profile)
    out_dir = Path(out_dir).resolve()
    # The kernel inherits the environment: deterministic hashing, matplotlib's inline backend (MPLBACKEND=Agg
    # would override it; the tutorial's widgets draw live), progress bars on the console, not in the notebook.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    saved = {key: os.environ.pop(key, None) for key in ("MPLBACKEND", ENV)}
    os.environ[ENV] = "console" if progress else "off"
    statuses: dict[str, dict] = {}
    bar = tqdm(names, desc=f"notebooks ({profile})", unit="nb", disable=not progress)
    try:
        with OutputLock(out_dir):  # one writer per folder
            for restored in recover_folders(out_dir):
                bar.write(f"note: {restored}: the results from before a run that was killed are back in "
                          f"{out_dir / restored}", file=sys.stderr)
            for name in bar:
                bar.set_postfix_str(name)
                nb_out = out_dir / name
                previous = _start_notebook_folder(nb_out)
                given = run_parameters(name, profile, seed, measured_dir)
                params = {"out_dir": str(nb_out), **given, **(extra_parameters or {})}
                started = time.perf_counter()
                status = {"status": "ok", "profile": given.get("profile", "none"),
                          "parameters": non_default_text(name, {**given, **(extra_parameters or {})})}
                executed = nb_out / f"{name}.ipynb"
                # papermill saves after every cell: beside the folder until the end, so that nothing it writes
                # late lands in a folder put back after an interrupt
                running = out_dir / f".{name}.running.ipynb"
                try:
                    try:
                        # no fd capture: what the kernel and its children write to stderr goes to the console
                        _execute(lambda: pm.execute_notebook(
                            load_notebook(name), str(running), parameters=params, kernel_name="python3",
                            progress_bar=False, cwd=str(project_root()), kernel_manager_class=_kernel_manager(),
                            extra_arguments=["--IPKernelApp.capture_fd_output=False"]), name)
                    except PapermillExecutionError as exc:
                        status.update(status="failed", error=f"{exc.ename}: {str(exc.evalue)[:300]}")
                    except Exception as exc:  # the kernel died, the notebook file is missing...
                        status.update(status="failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")
                    finally:
                        _KERNELS.clear()
                    if running.exists():
                        nb_out.mkdir(exist_ok=True)  # a notebook that removed its own folder
                        os.replace(running, executed)
                    if html and executed.exists():
                        export_html(executed)
                except BaseException:  # interrupted: the previous results stay as they were
                    running.unlink(missing_ok=True)
                    _restore_notebook_folder(nb_out, previous)
                    raise
                where = _end_notebook_folder(nb_out, previous, status["status"] == "ok")
                status["wall_seconds"] = round(time.perf_counter() - started, 1)
                statuses[name] = status
                if status["status"] != "ok":  # said even with --quiet, on stderr
                    bar.write(f"error: {name}: failed in {status['wall_seconds']:.1f} s ({status['error']}); "
                              f"executed copy in {where}", file=sys.stderr)
                elif progress:
                    bar.write(f"{name}: ok in {status['wall_seconds']:.1f} s")
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
    return statuses


# Notebook parameters that `relibra reproduce` sets itself, and the option that sets each.
OWN_PARAMETERS = {"profile": "--profile", "seed": "--seed", "measured_dir": "--measured-dir",
                  "interactive": "(none: a reproduction is headless)"}


def check_own_options(names: list[str], named: bool, seed: int | None, measured_dir: str | None, parameters: dict,
                      out: str | None) -> str | None:
    """-p for what reproduce sets itself is refused, naming its option; -p out_dir is --out (a clash when both
    name folders); --seed and --measured-dir must apply to every notebook named (all by default: to one).
    Returns the output folder given (or None)."""
    from relibra.experiments import get_notebook

    for name, option in OWN_PARAMETERS.items():
        if name in parameters:
            raise ConfigError(f"-p {name}: reproduce sets {name} itself; give {option}"
                              if option.startswith("--") else f"-p {name}: reproduce sets {name} itself {option}")
    if "out_dir" in parameters:
        given = parameters.pop("out_dir")
        if out is not None and str(given) != out:
            raise ConfigError(f"-p out_dir {given} and --out {out} name two output folders; give one (--out)")
        out = str(given)
    for flag, key, value in (("--seed", "seed", seed), ("--measured-dir", "measured_dir", measured_dir)):
        if value is None:
            continue
        without = [n for n in names if key not in get_notebook(n).Params.names()]
        if without and (named or len(without) == len(names)):
            raise ConfigError(f"{flag} {value}: notebook{'s' if len(without) > 1 else ''} {', '.join(without)} "
                              f"take{'' if len(without) > 1 else 's'} no {key}")
    return out


def non_default_text(name: str, parameters: dict) -> str:
    """`parameters` of notebook `name` that differ from its defaults, as the manifest's non_default ("ep=16,
    seed=1"; "" when none), for REPORT.md where a run wrote no manifest."""
    from relibra.experiments import get_notebook

    return ", ".join(f"{k}={v}" for k, v in get_notebook(name).Params.non_default(parameters).items())


def run_parameters(name: str, profile: str, seed: int, measured_dir: str | None) -> dict:
    """reproduce's options as the parameters notebook `name` declares: profile, seed, measured_dir and
    interactive=False (headless)."""
    from relibra.experiments import get_notebook

    declared = get_notebook(name).Params.names()
    given = {"profile": profile, "seed": None if seed is None else int(seed), "measured_dir": measured_dir,
             "interactive": False}
    return {k: v for k, v in given.items() if k in declared and v is not None}


def check_parameters(names: list[str], profile: str, seed: int, measured_dir: str | None, parameters: dict) -> None:
    """Every -p parameter checked against each chosen notebook's Params before any kernel starts."""
    from relibra.experiments import get_notebook

    for name in names:
        get_notebook(name).create(**run_parameters(name, profile, seed, measured_dir), **parameters)


def parse_parameters(pairs: list[list[str]] | None) -> dict:
    """-p NAME VALUE pairs as papermill's CLI reads them (numbers, True/False/None, else strings)."""
    import yaml

    out = {}
    for name, value in pairs or []:
        parsed = yaml.safe_load(value) if value.strip() else value
        out[name] = parsed if isinstance(parsed, (int, float, bool, type(None))) else value
    return out


DEFAULT_OUT = "results"


def output_folder(out: str | None, seed: int, parameters: dict) -> str:
    """--out when given; else results/ for a default run, results/runs/<parameters>/ (results/runs/ep=16,seed=1)
    for one with other parameters, which must not rewrite the default run's results."""
    if out is not None:
        return out
    changed = {**({"seed": seed} if seed else {}), **parameters}
    if not changed:
        return DEFAULT_OUT
    slug = ",".join(f"{k}={v}" for k, v in sorted(changed.items()))
    return str(Path(DEFAULT_OUT) / "runs" / re.sub(r"[^A-Za-z0-9_.,=+-]", "_", slug))


def check_output_folder(out: str, flag: str = "--out") -> None:
    """Refuse an output folder inside the repository, other than results/, where git tracks anything: a run
    rewrites what it finds there."""
    import subprocess

    root = project_root().resolve()
    path = Path(out).resolve()
    if not path.is_relative_to(root) or path.is_relative_to(root / DEFAULT_OUT):
        return
    try:
        tracked = subprocess.run(["git", "-C", str(root), "ls-files", "--", str(path)], capture_output=True,
                                 text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        tracked = "(git unavailable: every folder of the repository counts as tracked)"
    if tracked:
        raise ConfigError(f"{flag} {out}: inside the repository's tracked files ({tracked.splitlines()[0]}, ...); "
                          f"give a folder under {DEFAULT_OUT}/ or outside the repository")


def known() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The notebooks and the profiles a reproduction can run."""
    from relibra.experiments import NOTEBOOKS, PROFILES

    return NOTEBOOKS, tuple(PROFILES)
