"""results/REPORT.md: the headline ratios next to the paper's claims, what moves them, which results
are simulated and which measured (and on what hardware), the environment and every figure.

It reads every notebook's typed result and manifest back through the registry
(relibra.experiments.registry.load_results), so running one notebook refreshes the report without
dropping the others; each notebook's row says which profile made it and when. A notebook module
that defines `section(summary, manifest, md_table)` puts its section at the top, in notebook order
(a module with SECTION_FIRST = True before the others: notebook 12's verdict table per set-up card);
then come what ran, the environment and every figure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from relibra.experiments import NOTEBOOKS, environment, get_profile
from relibra.experiments.registry import Loaded, in_shown_order, load_results
from relibra.labels import CLAIMS
from relibra.paths import write_text


def read_manifests(out_dir: str | Path) -> dict[str, dict]:
    """{notebook: manifest} for every notebook folder under out_dir that holds a manifest.json, with
    "written" (its file's time)."""
    found = {}
    for name in NOTEBOOKS:
        path = Path(out_dir) / name / "manifest.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
            found[name]["written"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
    return found


def md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (pandas' to_markdown needs tabulate, which the kit avoids)."""
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "|".join("---" for _ in df.columns) + "|"]
    for row in df.itertuples(index=False):
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v).replace("|", "\\|").replace("\n", " ") for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notebook_sections(results: dict[str, Loaded]) -> str:
    """The sections of the notebook modules that write one: first those whose module sets SECTION_FIRST
    (the verdict map's table per set-up card), then the others, in notebook order."""
    shown = in_shown_order(x for x in results.values() if x.notebook.section is not None)
    return "".join(x.notebook.section(x.summary, x.manifest, md_table) + "\n" for x in shown)


def sources_section(manifests: dict[str, dict], statuses: dict[str, dict]) -> str:
    """What ran: per notebook with a manifest or a status of this run (status, wall seconds)."""
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


def environment_section() -> str:
    env = environment()
    return f"## Environment\n\n{md_table(pd.DataFrame({'item': list(env), 'value': [str(v) for v in env.values()]}))}\n"


def figures_section(manifests: dict[str, dict]) -> str:
    parts = ["## Figures\n"]
    for name, man in manifests.items():
        parts.append(f"### {name}\n\n_{man.get('scale_note', '')}_\n")
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
    claims = CLAIMS["relibra_over_megatron"], CLAIMS["relibra_over_eplb_plus"], CLAIMS["gap_to_balanced"]
    head = (f"# ReLibra kit: reproduction report\n\n{notebook_sections(results)}Last run: profile **{profile}**: "
            f"{get_profile(profile)}.{mixed}\nWritten {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
            f"{wall}\n\nPaper's claims (abstract): ReLibra {claims[0].paper} over Megatron-LM, {claims[1].paper} over "
            f"EPLB given oracle loads, {claims[2].paper} of the balanced ideal, measured on 20 nodes x 8 Hopper GPUs. "
            "The kit's throughput figures are simulated (see below); notebook 08 puts CPU measurements of the real "
            "runtime next to the simulator at toy scale and states from its numbers whether they agree.\n\n")
    if failed:
        head += "**Failed notebooks:** " + ", ".join(f"{n} ({statuses[n].get('error', '')})" for n in failed) + "\n\n"
    path = out_dir / "REPORT.md"
    sections = sources_section(manifests, statuses), environment_section(), figures_section(manifests)
    write_text(path, head + "\n".join(sections))
    return path
