"""The `relibra` command line. Each module in this package adds its subcommands through a
`register(subparsers)` function, found at start-up, so a new command is one new file.

Every command module is imported to build the parser, so each imports its work (numpy, pandas, torch,
the experiments) inside the function that runs the command: `relibra --help` and a mistyped flag
answer without loading them."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import signal
import sys
import threading

from relibra.errors import RelibraError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that takes no abbreviations (`--profil` is an error, not `--profile`); its
    subcommands' parsers are of the same class."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="relibra", description="ReLibra reproduction kit: routing traces, "
                                     "balancing policies, cluster simulator, distributed runtime, RL workload.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        module.register(sub)
    return parser


# Arguments that name something the command will write. Each is checked before the command runs
# (relibra.paths.check_output_path), so a bad path fails at once, not after the work is done.
OUTPUT_ARGS = ("out",)


def _check_outputs(args: argparse.Namespace) -> None:
    from relibra.paths import check_output_path

    for name in OUTPUT_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_output_path(value, flag="--" + name.replace("_", "-"))


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like SIGINT's KeyboardInterrupt so that every clean-up on the way out
    runs (ranks stopped, temporary folders and notebook kernels removed)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def _ending_signals_interrupt():
    """SIGTERM and SIGHUP end the command like SIGINT while it runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    def command() -> int:
        _check_outputs(args)
        return int(args.func(args) or 0)

    return run_command(command)


def run_command(command) -> int:
    """Run command() -> exit code; every failure the kit expects becomes one `error:` line on stderr
    and its exit code. SIGTERM and SIGHUP stop it like SIGINT."""
    try:
        with _ending_signals_interrupt():
            return command()
    except Terminated as exc:
        print(f"error: stopped by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    except RelibraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; exit quietly like other Unix tools.
        sys.stderr.close()
        return 141
    except OSError as exc:  # FileNotFoundError, NotADirectoryError, a full disk, ...
        if exc.filename is not None and exc.strerror:
            print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        else:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:
        print(f"error: out of memory ({exc or 'MemoryError'})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
