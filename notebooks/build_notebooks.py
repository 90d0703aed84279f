"""Write notebooks/00_tutorial.ipynb ... 09_rl_workload.ipynb from the specs in notebook_specs.py, without outputs.

    python notebooks/build_notebooks.py          # rewrite all ten
    python notebooks/build_notebooks.py --check  # exit 1 if a committed notebook differs from its spec

Every notebook has the same skeleton, so they stay consistent: a title and what it teaches, a
papermill `parameters` cell (tagged "parameters"), a set-up cell that resolves the parameters against
the profile (relibra.experiments.start), then narrative and calls into relibra.experiments (numbers)
and relibra.plots (figures). No logic lives in a notebook.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from notebook_specs import SPECS, code, md  # noqa: E402  (kept in its own file: the narrative is long)

COMMON_PARAMETERS = '''\
# Parameters: papermill overrides any of these, e.g. `-p profile paper -p seed 1`.
# None means "the profile's default" (see relibra.experiments.PROFILES).
profile = "laptop"    # tiny | laptop (default, minutes on 2 cores) | paper (the paper's scale) | gpu (reads measured runs)
model = None          # model preset, or several for the grid: "qwen3-30b-a3b,glm-4.5-air,qwen3-235b-a22b"
workload = None       # math | science | instruct | code | mixed, or several: "math,code"
ep = None             # expert-parallel size (GPUs in one EP group)
cluster = None        # cluster preset: paper | h800 | nvl72 | cpu-gloo
policies = None       # comma-separated policy names, e.g. "megatron,eplb+,relibra"
steps = None          # training steps per routing trace
seed = 0              # same seed, same numbers
out_dir = None        # default: results/<notebook>
measured_dir = None   # gpu profile: folder holding measured results of real runs'''


def setup_cell(name: str, extra: tuple[str, ...] = ()) -> str:
    args = ["profile=profile", "out_dir=out_dir", "model=model", "workload=workload", "ep=ep", "cluster=cluster",
            "policies=policies", "steps=steps", "seed=seed", "measured_dir=measured_dir"] + [f"{e}={e}" for e in extra]
    lines = ",\n                ".join(args)
    return (f'from relibra import experiments as ex, plots\n\n'
            f'run = ex.start("{name}",\n                {lines})\n'
            f'cfg = run.config\nprint(cfg.scale_note())\nprint("results go to", cfg.out_dir)')


def build(name: str, title: str, intro: str, body: list, extra_params: str = "", extra_args: tuple[str, ...] = ()):
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    params = code(COMMON_PARAMETERS + ("\n" + extra_params.strip("\n") if extra_params else ""))
    params.metadata["tags"] = ["parameters"]
    nb.cells = [md(f"# {title}\n\n{intro.strip()}"), params, code(setup_cell(name, extra_args))] + body
    nb.cells.append(code("run.finish()\nprint('figures:', [f['name'] for f in run.figures])\n"
                         "print('tables:', [t['file'] for t in run.tables])"))
    # Stable cell ids, so rebuilding an unchanged spec gives byte-identical files.
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:2]}-{i:02d}"
    return nb


def render(name: str) -> str:
    spec = SPECS[name]
    nb = build(name, spec["title"], spec["intro"], spec["body"], spec.get("extra_params", ""),
               spec.get("extra_args", ()))
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name in SPECS:
        path = HERE / f"{name}.ipynb"
        text = render(name)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if check and stale:
        print("out of date (run python notebooks/build_notebooks.py):", ", ".join(stale))
        return 1
    if not check:
        print(f"wrote {len(SPECS)} notebooks to {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
