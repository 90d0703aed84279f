"""Every command in a ```bash block of README.md and docs/notebooks.md that runs notebooks is run here, at
the `tiny` profile and into a temporary folder: `./reproduce.sh ...` and `relibra reproduce ...` through
`python -m relibra reproduce`, and the papermill recipe (mkdir, jupytext, papermill) as written. The
rewrite touches only where results go and how big the run is: `--profile X` and `-p profile X` become
tiny, `--out` and the `results/` paths move into the temporary folder, `.venv/bin/` is this interpreter's
folder, and the README's `mine.npz` (a trace of your own routing, made by `relibra trace import` from
files the kit does not ship) is the shipped `data/tiny_math_ep4.npz`. `./reproduce.sh test` is this
test suite and is not run from inside it; the `gpu` profile's recipe (torchrun on GPU nodes, then
notebook 08 reading what they measured) needs GPUs. Those, and every other `relibra` command of the
blocks (the README's tour of the command line), are parsed by the kit's command-line parser, so a
renamed option fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from relibra.cli import build_parser
from relibra.experiments import project_root

ROOT = project_root()
DOCS = ("README.md", "docs/notebooks.md")
PLACEHOLDERS = {"mine.npz": "data/tiny_math_ep4.npz"}  # the README's own-routing trace


def commands(path: str) -> list[tuple[list[str], bool]]:
    """(words, on GPU nodes) of each shell command of `path`'s ```bash blocks: continuation lines joined,
    comments, blank lines and shell loops' own words (for ...; do, done) dropped; a block that calls
    torchrun is the GPU recipe."""
    text = (ROOT / path).read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        gpu = "torchrun" in block
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] not in ("for", "done"):
                out.append((words, gpu))
    return out


def relibra_args(words: list[str]) -> list[str] | None:
    """The arguments after `relibra` (or `python -m relibra`, or ./reproduce.sh as `reproduce ...`); None
    for another program."""
    if words[0] == "./reproduce.sh":
        return None if words[1:2] == ["test"] else ["reproduce", *words[1:]]
    if words[0] == "relibra":
        return words[1:]
    if words[0].endswith("python") and words[1:3] == ["-m", "relibra"]:
        return words[3:]
    if words[0] == "torchrun":
        return words[words.index("relibra") + 1:]
    return None


def tiny_reproduce(args: list[str], out: Path) -> list[str]:
    """`relibra reproduce` arguments at the tiny profile into `out` (every other argument as written)."""
    kept, i = [], 0
    while i < len(args):
        if args[i] in ("--profile", "--out"):
            i += 2
            continue
        if args[i] == "-p" and args[i + 1] == "profile":
            i += 3
            continue
        kept.append(PLACEHOLDERS.get(args[i], args[i]))
        i += 1
    return [*kept, "--profile", "tiny", "--out", str(out)]


def shell_line(words: list[str], tmp: Path) -> list[str]:
    """A recipe line (mkdir, jupytext, papermill) with results/ under `tmp`, -p profile tiny and this
    interpreter's .venv/bin."""
    out = []
    for i, w in enumerate(words):
        if w.startswith(".venv/bin/"):
            w = str(Path(sys.executable).parent / w.removeprefix(".venv/bin/"))
        elif w.startswith("results/") or w == "results":
            w = str(tmp / w)
        elif i >= 2 and words[i - 2] == "-p" and words[i - 1] == "profile":
            w = "tiny"
        out.append(w)
    return out


def plan() -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """(reproduce argument lists without --out, recipe lines, other relibra argument lists) of both pages."""
    reproduce, recipe, parsed = [], [], []
    for path in DOCS:
        for words, gpu in commands(path):
            args = relibra_args(words)
            if words[0] == "./reproduce.sh" and args is None:
                continue  # ./reproduce.sh test: this suite
            if args is None:
                recipe.append(words)
            elif args[0] == "reproduce" and not gpu:
                key = tiny_reproduce(args, Path("OUT"))[:-2]
                if key not in reproduce:
                    reproduce.append(key)
            else:
                parsed.append(args)
    return reproduce, recipe, parsed


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg"}


def test_the_pages_hold_the_commands_this_test_runs():
    reproduce, recipe, parsed = plan()
    assert len(reproduce) >= 6 and any(w[0].endswith("papermill") for w in recipe), (reproduce, recipe)
    assert any(a[0] == "run" for a in parsed) and any(a[0] == "simulate" for a in parsed)
    # the papermill recipe writes next to, never into, the reproduction's results/<notebook>/
    papermill = next(w for w in recipe if w[0].endswith("papermill"))
    out_dir = papermill[papermill.index("out_dir") + 1]
    assert not re.fullmatch(r"results/\d\d_[a-z_]+/?", out_dir), out_dir


@pytest.mark.parametrize("args", plan()[2], ids=lambda a: " ".join(a)[:60])
def test_other_commands_parse(args):
    build_parser().parse_args(args)


@pytest.mark.docs_commands
def test_every_reproduce_command_runs_at_tiny(tmp_path):
    """Each reproduce command of the pages at the tiny profile; the whole run (`./reproduce.sh` with no
    notebook named) is tests/test_notebooks.py's, which runs every notebook at the tiny profile."""
    failures = []
    for i, key in enumerate(k for k in plan()[0] if k != ["reproduce", "--profile", "tiny"]):
        out = tmp_path / f"run{i}"
        argv = [sys.executable, "-m", "relibra", *key, "--out", str(out), "--quiet"]
        done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            failures.append(f"{shlex.join(key)} -> exit {done.returncode}: {done.stderr[-1500:]}")
            continue
        assert (out / "REPORT.md").exists(), key
    assert not failures, "\n".join(failures)


@pytest.mark.docs_commands
def test_the_papermill_recipe_runs_at_tiny(tmp_path):
    for words in plan()[1]:
        line = shell_line(words, tmp_path)
        done = subprocess.run(line, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{shlex.join(line)}:\n{done.stdout[-1000:]}\n{done.stderr[-2000:]}"
    manifests = list((tmp_path / "results").rglob("manifest.json"))
    assert manifests, "the papermill recipe wrote no results"
    assert all(m.parent.parent == tmp_path / "results" / "try" for m in manifests), manifests
