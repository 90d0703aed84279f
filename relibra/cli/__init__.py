"""The `relibra` command line. Each module in this package adds its subcommands through a
`register(subparsers)` function, found at start-up, so a new command is one new file."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from relibra.errors import RelibraError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relibra", description="ReLibra reproduction kit: routing traces, "
                                     "balancing policies, cluster simulator, distributed runtime, RL workload.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RelibraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; exit quietly like other Unix tools.
        sys.stderr.close()
        return 141
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
