"""Where the kit's files are (project_root, resolve_path), and paths the kit writes: checked before any work, so that a bad `--out` fails at once instead of
after minutes of simulation or training; and written atomically, so that no fault leaves a half-written
file or destroys the one it was replacing.

`atomic_path(path)` yields a temporary name in the same folder (same suffix, so writers that choose a
format by it still do) and renames it over `path` only when the block finished; on any failure the
temporary file is removed and the old file, if any, is left as it was. An OSError that names no file
(a full disk, mid-write) or the temporary one is raised again naming `path`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

from relibra.errors import ConfigError


def project_root() -> Path:
    """The repository root (holding pyproject.toml) when running from a checkout, else the cwd."""
    here = Path(__file__).resolve().parents[1]  # relibra/paths.py
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def resolve_path(path) -> Path:
    """`path` with ~ expanded, relative to the repository root unless absolute."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else project_root() / p


def check_output_path(path: str | os.PathLike, kind: str | None = None, flag: str = "--out") -> str:
    """Raise ConfigError unless `path` can be written; return it as a str.

    kind: "file" (the path will be a file), "dir" (a folder) or None (either). Checks, without
    creating anything: the path is not empty; no existing ancestor is a regular file (writing
    `base.npz/x.npz` where base.npz is a file); the nearest existing ancestor is a writable folder;
    an existing path is of the right kind (a file path is not a folder and vice versa).
    """
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{flag}: the output path is empty")
    full = os.path.abspath(text)
    if os.path.lexists(full):
        if kind == "file" and os.path.isdir(full):
            raise ConfigError(f"{flag} {text}: is a folder; give a file name")
        if kind == "dir" and not os.path.isdir(full):
            raise ConfigError(f"{flag} {text}: exists and is not a folder")
        if not os.path.isdir(full) and not os.access(full, os.W_OK):
            raise ConfigError(f"{flag} {text}: the file exists and is not writable")
        if os.path.isdir(full) and not os.access(full, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {text}: the folder is not writable")
        return text
    parent = os.path.dirname(full)
    while not os.path.lexists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if not os.path.isdir(parent):
        raise ConfigError(f"{flag} {text}: {parent} is a regular file, not a folder, so nothing can be written "
                          f"under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {text}: the folder {parent} is not writable")
    return text


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; rename it to `path` when the block ends without error."""
    final = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(final))
    stem, suffix = os.path.splitext(name)
    tmp = os.path.join(folder, f".{stem}.{secrets.token_hex(4)}.partial{suffix}")
    try:
        yield tmp
        os.replace(tmp, final)
    except OSError as exc:
        _remove(tmp)
        if exc.filename is None or os.path.abspath(exc.filename) == tmp:  # name the file the caller asked for
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno or errno.EIO), final) from exc
        raise
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs):
    """open() for writing through atomic_path: the file appears complete at `path`, or not at all."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
