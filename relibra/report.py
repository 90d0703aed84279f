"""results/REPORT.md: the notebook modules' own sections (the verdict table per set-up card first), what ran
(simulated or measured, on what hardware), the notebook folders, the environment and every figure. It reads
every notebook's typed result and manifest back (relibra.experiments.registry.load_results), so running one
notebook refreshes the report without dropping the others.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from relibra.display import md_table as display_table
from relibra.experiments import NOTEBOOKS, environment, get_profile
from relibra.experiments.registry import Loaded, in_shown_order, load_results
from relibra.labels import PAPER_CLAIMS
from relibra.paths import write_text


def _utc(seconds: float, fmt: str = "%Y-%m-%d %H:%M UTC") -> str:
    return time.strftime(fmt, time.gmtime(seconds))


def read_manifests(out_dir: str | Path) -> dict[str, dict]:
    """{notebook: manifest} of every notebook folder under out_dir with a manifest.json, with "written" (its
    file's time)."""
    found = {}
    for name in NOTEBOOKS:
        path = Path(out_dir) / name / "manifest.json"
        if path.exists():
            found[name] = {**json.loads(path.read_text()), "written": _utc(path.stat().st_mtime)}
    return found


def md_table(df: pd.DataFrame) -> str:
    """A data frame as a markdown table (relibra.display.md_table), floats to 3 significant digits."""
    return display_table(df.columns, [[f"{v:.3g}" if isinstance(v, float) else v for v in row]
                                      for row in df.itertuples(index=False)])


def sources_section(manifests: dict[str, dict], statuses: dict[str, dict]) -> str:
    """What ran: a row per notebook with a manifest or a status of this run (status, wall seconds)."""
    rows = []
    for name in NOTEBOOKS:
        man, st = manifests.get(name), statuses.get(name, {})
        if man is None and not st:
            continue
        man = man or {}
        rows.append({
            "notebook": name, "profile": man.get("config", {}).get("profile", st.get("profile", "?")),
            "parameters": (st["parameters"] if st.get("status", "ok") != "ok" and "parameters" in st
                           else man.get("non_default")) or "defaults",
            "figures": len(man.get("figures", [])),
            "results are": "; ".join(f"{s['source']} ({s['hardware']})" for s in man.get("sources", [])) or "-",
            "wall s": st.get("wall_seconds", man.get("wall_seconds", float("nan"))), "written": man.get("written", "-"),
            "status": f"{st['status']} (this run)" if st else ("ok (earlier run)" if man else "missing")})
    if not rows:
        return "## What ran\n\nNo notebook has run yet.\n"
    return ("## What ran, and what is simulated or measured\n\n`simulated` numbers come from the kit's cost model "
            "(relibra.sim) on the named cluster preset, driven by routing traces; `measured` numbers are wall-clock "
            "times taken on the named hardware; `synthetic` marks statistics of generated routing traces, `real` "
            f"statistics of routing that a trained model chose.\n\n{md_table(pd.DataFrame(rows))}\n")


def _written(folder: Path) -> float:
    """When a folder's content was last written (its newest file's mtime; the folder's own if empty)."""
    return max((f.stat().st_mtime for f in folder.iterdir() if f.is_file()), default=folder.stat().st_mtime)


def notebook_folders(out_dir: str | Path) -> list[dict]:
    """Every notebook folder of out_dir, in notebook order: <nb>/ (its results, or what a stopped run left),
    <nb>.failed/ (a failed run's executed notebook) and .<nb>.previous/ (results a killed run had set aside),
    each with what it holds, when it was written and whether it is stale (superseded or incomplete)."""
    out_dir, rows = Path(out_dir), []
    for name in NOTEBOOKS:
        current, failed, previous = out_dir / name, out_dir / f"{name}.failed", out_dir / f".{name}.previous"
        manifest = current / "manifest.json"
        results_at = manifest.stat().st_mtime if manifest.is_file() else None
        failed_at = _written(failed) if failed.is_dir() else None
        if current.is_dir() and results_at is None:
            rows.append({"folder": f"{name}/", "holds": "incomplete: no manifest.json (a run stopped before its end)",
                         "written": _written(current), "stale": "yes" + (
                             f": the earlier results are in {previous.name}" if previous.is_dir() else "")})
        elif current.is_dir():
            rows.append({"folder": f"{name}/", "holds": "results", "written": _written(current), "stale": (
                f"yes: a later run failed (see {failed.name})" if failed_at is not None and failed_at > results_at
                else "no")})
        if failed_at is not None:
            rows.append({"folder": f"{failed.name}/", "holds": "a failed run's executed notebook (the failing cell)",
                         "written": failed_at,
                         "stale": f"yes: {name}/ holds a newer run" if results_at and results_at > failed_at else "no"})
        if previous.is_dir():
            rows.append({"folder": f"{previous.name}/", "holds": "results set aside by a run that was killed; the "
                         "next `relibra reproduce` into this folder puts them back", "written": _written(previous),
                         "stale": "no"})
    return [{**row, "written": _utc(row["written"], "%Y-%m-%d %H:%M:%S UTC")} for row in rows]


def folders_section(out_dir: str | Path) -> str:
    rows = notebook_folders(out_dir)
    if not rows:
        return "## Notebook folders\n\nNone yet.\n"
    stale = sum(r["stale"] != "no" for r in rows)
    return (f"## Notebook folders\n\nEvery notebook folder in this directory; {stale} of {len(rows)} stale "
            f"(superseded by a newer run of the notebook, or incomplete).\n\n{md_table(pd.DataFrame(rows))}\n")


def environment_section() -> str:
    env = environment()
    return f"## Environment\n\n{md_table(pd.DataFrame({'item': list(env), 'value': [str(v) for v in env.values()]}))}\n"


def interpretation(loaded: Loaded | None) -> str:
    """What a notebook's figures show: its story, or, where its own section opens the report, a pointer there."""
    if loaded is None:
        return ""
    if loaded.notebook.section is not None:
        return "**What it shows:** see its section at the top of this report.\n"
    return f"**What it shows:** {loaded.notebook.story(loaded.summary)}\n"


def figures_section(manifests: dict[str, dict], results: dict[str, Loaded]) -> str:
    parts = ["## Figures\n"]
    for name, man in manifests.items():
        parts.append(f"### {name}\n\n_{man.get('scale_note', '')}_\n")
        parts.append(interpretation(results.get(name)))
        for fig in man.get("figures", []):
            parts.append(f"![{fig['name']}]({name}/{fig['png']})\n\n**{fig['name']}** - {fig['caption']} "
                         f"[{fig['source']} ({fig['hardware']}); [SVG]({name}/{fig['svg']})]\n")
        tables = ", ".join(f"[{t['file']}]({name}/{t['file']})" for t in man.get("tables", []))
        parts.append((f"Tables: {tables}\n\n" if tables else "")
                     + f"Executed notebook: [{name}/{name}.ipynb]({name}/{name}.ipynb) ([HTML]({name}/{name}.html))\n")
    return "\n".join(parts)


def write_report(out_dir: str | Path, profile: str, statuses: dict[str, dict] | None = None,
                 total_seconds: float | None = None) -> Path:
    """Write <out_dir>/REPORT.md from the results found there; returns its path."""
    out_dir, statuses = Path(out_dir), statuses or {}
    results, manifests = load_results(out_dir), read_manifests(out_dir)
    failed = [n for n, s in statuses.items() if s.get("status") not in (None, "ok")]
    profiles = sorted({m.get("config", {}).get("profile", "?") for m in manifests.values()} - {"none"})
    mixed = (f" Results present come from the profile(s) {', '.join(profiles)}: each notebook's row below names its "
             "own." if profiles and profiles != [profile] else "")
    wall = (f" Wall time of this run: {total_seconds / 60:.1f} min ({total_seconds:.0f} s) for {len(statuses)} "
            "notebook(s)." if total_seconds is not None else "")
    claims = "; ".join(c.statement for c in PAPER_CLAIMS)
    sections = "".join(x.notebook.section(x, md_table) + "\n"
                       for x in in_shown_order(x for x in results.values() if x.notebook.section is not None))
    head = (f"# ReLibra kit: reproduction report\n\n{sections}Last run: profile **{profile}**: "
            f"{get_profile(profile)}.{mixed}\nWritten {_utc(time.time())}."
            f"{wall}\n\nPaper's claims (abstract; EPLB+ is the paper's EPLB given oracle loads): {claims}; "
            "measured on 20 nodes x 8 Hopper GPUs. "
            "The kit's throughput figures are simulated (see below); notebook 08 puts CPU measurements of the real "
            "runtime next to the simulator at toy scale and states from its numbers whether they agree.\n\n")
    if failed:
        head += "**Failed notebooks:** " + ", ".join(f"{n} ({statuses[n].get('error', '')})" for n in failed) + "\n\n"
    path = out_dir / "REPORT.md"
    write_text(path, head + "\n".join((sources_section(manifests, statuses), folders_section(out_dir),
                                        environment_section(), figures_section(manifests, results))))
    return path
