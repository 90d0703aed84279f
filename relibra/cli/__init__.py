"""The `relibra` command line: each module of this package adds its subcommands through `register(subparsers)`.
Every command module is imported to build the parser, so each imports its work (torch, the experiments)
inside the function that runs the command: `relibra --help` and a mistyped flag answer without loading it."""

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
    subcommands' parsers are of the same class. An unknown flag is reported by the subcommand it was
    given to, with that subcommand's usage (argparse passes it up to the top-level parser)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen_parser(self, parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand parser that `args` went through (`relibra trace stats` -> its parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return chosen_parser(action.choices[name], args)
    return parser


def version_text() -> str:
    """relibra's version and where it runs from, with the Python, torch and megatron-core it runs with.
    The two libraries' versions are their installed distributions' (importlib.metadata), so this
    imports neither (megatron-core takes seconds to import)."""
    import importlib.metadata
    import os
    import platform

    import relibra

    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (f"relibra {relibra.__version__} ({os.path.dirname(relibra.__file__)}); Python {platform.python_version()}, "
            f"torch {dist('torch')}, megatron-core {dist('megatron-core')}")


class _Version(argparse.Action):
    """--version: print version_text() (computed only when asked; argparse's own action would wrap it) and exit."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def policy_list(text: str, flag: str = "--policies", extra: tuple[str, ...] = ()) -> list[str]:
    """The comma-separated policy names of `text`, every one checked before any work: ConfigError names
    each unknown one and lists the known ones (relibra.policies.POLICY_NAMES, plus `extra`)."""
    from relibra.errors import ConfigError
    from relibra.studies.params import split_items
    from relibra.policies import POLICY_NAMES

    names = split_items(text)
    if not names or "" in names:
        raise ConfigError(f"{flag} names no policy" if not names else f"{flag}: an empty policy name in {text!r}")
    known = [*POLICY_NAMES, *extra]
    unknown = [p for p in dict.fromkeys(names) if p not in known]
    if unknown:
        raise ConfigError(f"{flag}: unknown polic{'ies' if len(unknown) > 1 else 'y'} "
                          f"{', '.join(map(repr, unknown))}; known: {', '.join(known)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="relibra", description="ReLibra reproduction kit: routing traces, "
                                     "balancing policies, cluster simulator, distributed runtime, RL workload.")
    parser.add_argument("--version", action=_Version,
                        help="print relibra's version and the Python, torch and megatron-core it runs with")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        module.register(sub)
    return parser


# Arguments that name something the command will write, with the kind of path (None: a file or a folder, as
# the command says), checked before the command runs: a bad path fails at once, not after the work is done.
OUTPUT_ARGS = {"out": None, "metrics": "file"}


def _check_outputs(args: argparse.Namespace) -> None:
    from relibra.paths import check_output_path

    for name, kind in OUTPUT_ARGS.items():
        if isinstance(getattr(args, name, None), str):
            check_output_path(getattr(args, name), kind=kind, flag="--" + name)


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
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        print(version_text())  # without building the parser, which imports every command module
        return 0
    parser = build_parser()

    def command() -> int:
        args = parser.parse_args(argv)  # a value a flag's Kind refuses is a ConfigError: one `error:` line
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
