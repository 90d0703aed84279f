"""One notebook run: where its figures and tables go, and the manifest that relibra.report reads."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.config import Config, jsonable
from relibra.paths import atomic_path, write_text
from relibra.plots import save_figure


class Run:
    """Saves a notebook's figures and tables under `config.out_dir` and records them in a manifest.

    Each saved figure carries its caption and whether it shows simulated or measured numbers (and on
    what hardware); relibra.report reads `manifest.json` to write results/REPORT.md.
    """

    def __init__(self, config: Config, spec=None, non_default: dict | None = None):
        self.config = config
        self.spec = spec  # the notebook's registry.NotebookSpec
        self.non_default = non_default or {}  # parameters set away from the notebook's defaults
        self.started = time.perf_counter()
        self.figures: list[dict] = []
        self.tables: list[dict] = []
        self.sources: dict[str, dict] = {}
        config.out_dir.mkdir(parents=True, exist_ok=True)

    def compute(self):
        """The spec's compute function on this run's Config; its tables and fields saved here."""
        result = self.spec.compute(self.config)
        result.save(self)
        return result

    def story(self, result) -> str:
        """The spec's narrative of `result` (markdown): what to notice, computed from the numbers."""
        return self.spec.narrative(result)

    def try_this(self) -> str:
        """The spec's "Try this" suggestions for this run's parameters, as a markdown list (each one's
        direction is checked by tests/test_lessons.py)."""
        return "\n".join(f"- {t.text(self.config)}" for t in self.spec.tries)

    @property
    def out_dir(self) -> Path:
        return self.config.out_dir

    def save_csv(self, table: pd.DataFrame, name: str, description: str = "") -> Path:
        """Write `table` as results/<notebook>/<name>.csv (tidy: one row per observation)."""
        path = self.out_dir / f"{name}.csv"
        with atomic_path(path) as tmp:
            table.to_csv(tmp, index=False, float_format="%.6g")
        self.tables.append({"file": path.name, "rows": int(len(table)), "description": description})
        return path

    def save_figure(self, fig, name: str, caption: str, source: str = "simulated", hardware: str | None = None) -> None:
        """Write `fig` as <name>.png and <name>.svg and record it in the manifest; source is 'simulated',
        'measured', 'synthetic' or 'real'. Returns nothing, so a notebook cell ending with it shows the
        figure only (not the paths)."""
        if source not in ("simulated", "measured", "synthetic", "real"):
            raise ConfigError(f"figure source must be simulated, measured, synthetic or real, got {source!r}")
        hardware = hardware or (self.config.cluster if source == "simulated" else "this machine")
        paths = save_figure(fig, self.out_dir / name)
        self.figures.append({"name": name, "png": paths[0].name, "svg": paths[1].name, "caption": caption,
                             "source": source, "hardware": hardware})
        self.sources.setdefault(f"{source}|{hardware}", {"source": source, "hardware": hardware})

    def finish(self) -> Path:
        """Write manifest.json (parameters, figures, tables, sources, wall seconds)."""
        manifest = {
            "notebook": self.config.notebook,
            "config": self.config.to_dict(),
            "scale_note": self.config.scale_note(),
            "non_default": ", ".join(f"{k}={v}" for k, v in jsonable(self.non_default).items()),
            "figures": self.figures,
            "tables": self.tables,
            "sources": list(self.sources.values()),
            "wall_seconds": round(time.perf_counter() - self.started, 2),
        }
        path = self.out_dir / "manifest.json"
        write_text(path, json.dumps(manifest, indent=2, sort_keys=True))
        return path
