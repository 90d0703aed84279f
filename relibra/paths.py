"""Checks on paths the kit will write, made before any work so that a bad `--out` fails at once
instead of after minutes of simulation or training."""

from __future__ import annotations

import os

from relibra.errors import ConfigError


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
