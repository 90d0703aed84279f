"""Progress bars (tqdm) that stay on the console.

`relibra reproduce` runs each notebook in a kernel whose environment holds RELIBRA_PROGRESS=console
(or off, with --quiet) and whose OS-level stderr is the console's (it starts the kernel without fd capture), so a bar
written there shows in the terminal and never lands in the executed notebook. Elsewhere (a shell,
JupyterLab) the bar is tqdm.auto's.
"""

from __future__ import annotations

import os
import sys

ENV = "RELIBRA_PROGRESS"


def _console() -> bool:
    return os.environ.get(ENV) in ("console", "off")


def progress(iterable=None, **kwargs):
    """tqdm(iterable, **kwargs), on the console when the kit runs a notebook headless.

    tqdm is imported here because the kind (std or auto) depends on the environment at call time."""
    if _console():
        from tqdm.std import tqdm

        kwargs.setdefault("file", sys.__stderr__)
        if os.environ[ENV] == "off":  # `relibra reproduce --quiet`
            kwargs["disable"] = True
        return tqdm(iterable, **kwargs)
    from tqdm.auto import tqdm

    return tqdm(iterable, **kwargs)


def write(line: str) -> None:
    """A line beside the bars (tqdm.write), on the same stream as `progress`."""
    from tqdm.std import tqdm

    tqdm.write(line, file=sys.__stderr__ if _console() else None)
