"""One notebook run: its checked parameters, where its figures and tables go, and the manifest that
relibra.report reads. A notebook's `parameters` cell (read by papermill) declares exactly the fields of its
module's Params; the cell after it calls `run = ex.start("02_throughput", globals())`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from relibra.display import json_safe
from relibra.errors import ConfigError
from relibra.experiments.base import facts_frame
from relibra.experiments.registry import Notebook, get_notebook
from relibra.paths import atomic_path, project_root, resolve_path, write_text


def notebook_source(notebook: str) -> Path:
    """notebooks/<notebook>.py, the Jupytext py:percent source of a notebook."""
    return project_root() / "notebooks" / f"{get_notebook(notebook).name}.py"


def assigned_names(source: str) -> list[str]:
    """The names a parameters cell's `source` assigns, in order, as papermill reads them (what `papermill
    --help-notebook` lists)."""
    from papermill.translators import PythonTranslator

    return [p.name for p in PythonTranslator.inspect({"source": source})]


def declared_parameters(notebook: str) -> list[str]:
    """The names the notebook's cell tagged "parameters" assigns, in order."""
    import jupytext

    cells = [c for c in jupytext.read(notebook_source(notebook)).cells if "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ConfigError(f"{notebook}: expected exactly one cell tagged 'parameters', found {len(cells)}")
    return assigned_names(cells[0].source)


def injected_names(namespace: dict) -> list[str]:
    """Names papermill injected into this kernel: the assignments of the cell run just before the current one
    where that cell is papermill's (it starts with '# Parameters'); [] otherwise (a run in JupyterLab)."""
    history = namespace.get("In") or namespace.get("_ih") or []
    if len(history) < 2 or not history[-2].lstrip().startswith("# Parameters"):
        return []
    return assigned_names(history[-2])


# Where a run without out_dir writes: never results/<notebook>/, which only `relibra reproduce` writes.
INTERACTIVE_DIR = Path("results") / "interactive"


class Run:
    """A notebook's checked parameters and sizes; saves its figures and tables under `out_dir` and records them
    in manifest.json (each figure with its caption, simulated or measured, on what hardware)."""

    def __init__(self, notebook: Notebook, params, sizes, non_default: dict):
        self.notebook, self.params, self.sizes = notebook, params, sizes
        self.non_default = non_default  # parameters set away from the notebook's defaults
        self.out_dir = resolve_path(getattr(params, "out_dir", None) or INTERACTIVE_DIR / notebook.name)
        self.started = time.perf_counter()
        self.figures: list[dict] = []
        self.tables: list[dict] = []
        self.sources: dict[str, dict] = {}
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def compute(self):
        """The module's compute(params, sizes), its result and facts saved here; facts that name nothing else
        were obtained on the simulator's machine at this scale."""
        result = self.notebook.compute(self.params, self.sizes)
        result.save(self)
        facts = facts_frame(self.notebook.facts(result, self.scale_note()),
                            f"{self.params.simulated_on()}; {self.scale_note()}")
        self.save_csv(facts, "facts", "one row per number the notebook found: fact, stat, value, unit, scope, on what",
                      None)
        return result

    def scale_note(self) -> str:
        """One line on how far this run is from the paper's scale, for captions."""
        return self.params.scale_note(self.sizes)

    def story(self, result) -> str:
        """The module's narrative of `result` (markdown)."""
        return self.notebook.story(self.notebook.summarize(result))

    def try_this(self) -> str:
        """The module's "Try this" suggestions for this run's parameters, as a markdown list."""
        return "\n".join(f"- {t.text(self.params, self.sizes)}" for t in self.notebook.TRIES)

    def save_csv(self, table: pd.DataFrame, name: str, description: str = "",
                 float_format: str | None = "%.6g") -> Path:
        """Write `table` as <out_dir>/<name>.csv, floats in `float_format` (None: every digit)."""
        path = self.out_dir / f"{name}.csv"
        with atomic_path(path) as tmp:
            table.to_csv(tmp, index=False, float_format=float_format)
        self.tables.append({"file": path.name, "rows": int(len(table)), "description": description})
        return path

    def save_figure(self, fig, name: str, caption: str, source: str = "simulated", hardware: str | None = None) -> None:
        """Write `fig` as <name>.png and .svg and record it; source: simulated, measured, synthetic or real.
        Returns nothing, so a cell ending with it shows the figure only."""
        if source not in ("simulated", "measured", "synthetic", "real"):
            raise ConfigError(f"figure source must be simulated, measured, synthetic or real, got {source!r}")
        if hardware is None:
            hardware = self.params.simulated_on() if source == "simulated" else "this machine"
        from relibra.plots import save_figure  # matplotlib: only where figures are drawn
        from relibra.plots.overlap import text_overlaps

        overlaps = text_overlaps(fig)  # before saving: in a kernel, save_figure closes the figure
        paths = save_figure(fig, self.out_dir / name)
        self.figures.append({"name": name, "png": paths[0].name, "svg": paths[1].name, "caption": caption,
                             "source": source, "hardware": hardware, "text_overlaps": overlaps})
        self.sources.setdefault(f"{source}|{hardware}", {"source": source, "hardware": hardware})

    def finish(self) -> Path:
        """Write manifest.json (parameters, figures, tables, sources, wall seconds)."""
        config = {"notebook": self.notebook.name, "profile": "none", **self.params.named_values(),
                  "out_dir": str(self.out_dir)}
        manifest = {
            "notebook": self.notebook.name, "config": config, "scale_note": self.scale_note(),
            "non_default": ", ".join(f"{k}={v}" for k, v in json_safe(self.non_default, strict=False).items()),
            "figures": self.figures, "tables": self.tables, "sources": list(self.sources.values()),
            "wall_seconds": round(time.perf_counter() - self.started, 2),
        }
        path = self.out_dir / "manifest.json"
        write_text(path, json.dumps(manifest, indent=2, sort_keys=True))
        return path


def start(notebook: str, namespace: dict | None = None, **params) -> Run:
    """Check a notebook's parameters and open its Run.

    namespace: the notebook's globals(), from which the declared parameters are read and against which the
    names papermill injected are checked. Or pass the parameters as keywords (tests, scripts): the module's
    defaults fill the rest.
    """
    nb = get_notebook(notebook)
    names = nb.Params.names()
    if namespace is not None:
        nb.Params.check_names(notebook, injected_names(namespace))
        missing = [n for n in names if n not in namespace]
        if missing:
            raise ConfigError(f"{notebook}: the parameters cell does not declare {', '.join(missing)}")
        params = {**{n: namespace[n] for n in names}, **params}
    values, sizes = nb.create(**params)
    from relibra.plots import set_style

    set_style()
    return Run(nb, values, sizes, non_default=nb.Params.non_default(params))
