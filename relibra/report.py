"""results/REPORT.md: every figure of a reproduction run, the headline ratios next to the paper's
claims, which results are simulated and which measured (and on what hardware), and the environment.

It reads what the notebooks left behind: `<out>/<notebook>/manifest.json` (written by
relibra.experiments.Run.finish), `<out>/02_throughput/throughput.csv` for the headline table and
`<out>/10_sensitivity/tornado.csv` for the sensitivity beside it. It is
rebuilt from every result present, so running one notebook refreshes the report without dropping the
others; each notebook's row says which profile made it and when.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from relibra.experiments import NOTEBOOKS, PAPER_CLAIMS, environment, headline_ratios


def read_manifests(out_dir: str | Path) -> dict[str, dict]:
    """{notebook: manifest} for every notebook folder under out_dir that holds a manifest.json."""
    out_dir = Path(out_dir)
    found = {}
    for name in NOTEBOOKS:
        path = out_dir / name / "manifest.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
            found[name]["written"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
    return found


def _md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (pandas' to_markdown needs tabulate, which the kit avoids)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append(f"{v:.3g}")
            else:
                cells.append(str(v).replace("|", "\\|").replace("\n", " "))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline_section(out_dir: Path, manifests: dict[str, dict]) -> str:
    csv = out_dir / "02_throughput" / "throughput.csv"
    if not csv.exists():
        return "## Headline ratios\n\nNotebook 02_throughput has not run, so there is no throughput table yet.\n"
    table = headline_ratios(pd.read_csv(csv))
    cfg = manifests.get("02_throughput", {}).get("config", {})
    where = (f"simulated on the `{cfg.get('cluster', '?')}` cluster preset at EP {cfg.get('ep', '?')}, "
             f"{manifests.get('02_throughput', {}).get('scale_note', '')}")
    shown = table.rename(columns={"claim": "ratio", "paper": "paper (abstract)", "kit": "this run",
                                  "range": "range over cases", "where_best": "best case", "cases": "cases"})
    return (f"## Headline ratios next to the paper's claims\n\nFrom notebook 02 (throughput: models x workloads; "
            f"{where}). Ratios of simulated tokens/s per (model, workload); `gap to balanced` is "
            f"1 - ReLibra / Balanced.\n\n{_md_table(shown)}\n")


def sensitivity_section(out_dir: Path, manifests: dict[str, dict]) -> str:
    """How far each headline ratio moves with one knob at a time (notebook 10's tornado), per knob."""
    csv = out_dir / "10_sensitivity" / "tornado.csv"
    head = "## How far the headline moves: sensitivity\n\n"
    if not csv.exists():
        return head + "Notebook 10_sensitivity has not run, so there is no sensitivity table yet.\n"
    from relibra.experiments.sensitivity import RATIOS

    t = pd.read_csv(csv)
    man = manifests.get("10_sensitivity", {})
    cfg = man.get("config", {})
    names = {"relibra_over_megatron": "ReLibra / Megatron", "relibra_over_eplb_plus": "ReLibra / EPLB+",
             "relibra_over_balanced_compute": "ReLibra / balanced-compute"}
    ratios = [r for r in RATIOS if r in set(t["ratio"])]
    first = t[t["ratio"] == ratios[0]]
    rows = []
    for knob in first["knob"]:  # sorted by the headline's swing
        row = {"knob": knob}
        for r in ratios:
            k = t[(t["ratio"] == r) & (t["knob"] == knob)].iloc[0]
            row[f"{names[r]}: low - high"] = f"{k['low']:.3f} - {k['high']:.3f}"
        rows.append(row)
    defaults = "; ".join(f"{names[r]} {float(t.loc[t['ratio'] == r, 'default'].iloc[0]):.3f}" for r in ratios)
    tops = "; ".join(f"{names[r]} with {t[t['ratio'] == r].iloc[0]['knob']} "
                     f"({t[t['ratio'] == r].iloc[0]['low']:.3f} - {t[t['ratio'] == r].iloc[0]['high']:.3f})"
                     for r in ratios)
    where = (f"simulated, `{cfg.get('model', '?')}`, {cfg.get('workload', '?')}, EP {cfg.get('ep', '?')} on the "
             f"`{cfg.get('cluster', '?')}` cluster preset, {man.get('scale_note', '')}")
    figure = next((f for f in man.get("figures", []) if f["name"] == "tornado"), None)
    image = f"\n![tornado](10_sensitivity/{figure['png']})\n" if figure else ""
    return (f"{head}From notebook 10 ({where}): one knob moved at a time around the default set-up, whose ratios "
            f"are {defaults}. Each moves most with: {tops}. Per knob, the lowest and highest ratio over its "
            f"values, knobs sorted by the swing of ReLibra / Megatron ([tornado.csv](10_sensitivity/tornado.csv)):"
            f"\n\n{_md_table(pd.DataFrame(rows))}\n{image}")


def sources_section(manifests: dict[str, dict], statuses: dict[str, dict]) -> str:
    rows = []
    for name in NOTEBOOKS:
        man = manifests.get(name)
        st = statuses.get(name, {})
        if man is None and not st:
            continue
        kinds = "; ".join(f"{s['source']} ({s['hardware']})" for s in (man or {}).get("sources", [])) or "-"
        rows.append({
            "notebook": name,
            "profile": (man or {}).get("config", {}).get("profile", st.get("profile", "?")),
            "figures": len((man or {}).get("figures", [])),
            "tables": len((man or {}).get("tables", [])),
            "results are": kinds,
            "wall s": st.get("wall_seconds", (man or {}).get("wall_seconds", float("nan"))),
            "written": (man or {}).get("written", "-"),
            "status": (st.get("status", "") + " (this run)") if st else ("ok (earlier run)" if man else "missing"),
        })
    if not rows:
        return "## What ran\n\nNo notebook has run yet.\n"
    note = ("`simulated` numbers come from the kit's cost model (relibra.sim) on the named cluster preset, "
            "driven by routing traces; `measured` numbers are wall-clock times taken on the named hardware; "
            "`synthetic` marks statistics of generated routing traces, `real` statistics of routing that a "
            "trained model chose.")
    return f"## What ran, and what is simulated or measured\n\n{note}\n\n{_md_table(pd.DataFrame(rows))}\n"


def environment_section(env: dict) -> str:
    df = pd.DataFrame({"item": list(env), "value": [str(v) for v in env.values()]})
    return f"## Environment\n\n{_md_table(df)}\n"


def figures_section(manifests: dict[str, dict]) -> str:
    parts = ["## Figures\n"]
    for name, man in manifests.items():
        parts.append(f"### {name}\n\n_{man.get('scale_note', '')}_\n")
        for fig in man.get("figures", []):
            label = f"{fig['source']} ({fig['hardware']})"
            parts.append(f"![{fig['name']}]({name}/{fig['png']})\n\n**{fig['name']}** - {fig['caption']} "
                         f"[{label}; [SVG]({name}/{fig['svg']})]\n")
        tables = ", ".join(f"[{t['file']}]({name}/{t['file']})" for t in man.get("tables", []))
        if tables:
            parts.append(f"Tables: {tables}\n")
        executed = f"{name}/{name}.ipynb"
        parts.append(f"Executed notebook: [{executed}]({executed}) ([HTML]({name}/{name}.html))\n")
    return "\n".join(parts)


def write_report(out_dir: str | Path, profile: str, statuses: dict[str, dict] | None = None,
                 total_seconds: float | None = None) -> Path:
    """Write <out_dir>/REPORT.md from the manifests found there; returns its path."""
    out_dir = Path(out_dir)
    statuses = statuses or {}
    manifests = read_manifests(out_dir)
    from relibra.experiments import get_profile

    try:
        description = get_profile(profile).description
    except Exception:
        description = ""
    failed = [n for n, s in statuses.items() if s.get("status") not in (None, "ok")]
    profiles = sorted({m.get("config", {}).get("profile", "?") for m in manifests.values()} - {"none"})
    mixed = (f" Results present come from the profile(s) {', '.join(profiles)}: each notebook's row below "
             "names its own." if profiles and profiles != [profile] else "")
    head = [
        "# ReLibra kit: reproduction report\n",
        f"Last run: profile **{profile}**: {description}.{mixed}",
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
        + (f" Wall time of this run: {total_seconds / 60:.1f} min ({total_seconds:.0f} s) for "
           f"{len(statuses)} notebook(s)." if total_seconds is not None else ""),
        "",
        f"Paper's claims (abstract): ReLibra {PAPER_CLAIMS['relibra_vs_megatron']} over Megatron-LM, "
        f"{PAPER_CLAIMS['relibra_vs_eplb+']} over EPLB given oracle loads, {PAPER_CLAIMS['relibra_gap_to_balanced']} "
        "of the balanced ideal, measured on 20 nodes x 8 Hopper GPUs. The kit's throughput figures are simulated "
        "(see below); notebook 08 puts CPU measurements of the real runtime next to the simulator at toy scale and "
        "states from its numbers whether they agree (its section below).",
        "",
    ]
    if failed:
        head.append("**Failed notebooks:** " + ", ".join(f"{n} ({statuses[n].get('error', '')})" for n in failed) + "\n")
    text = "\n".join(head) + "\n" + "\n".join([
        headline_section(out_dir, manifests),
        sensitivity_section(out_dir, manifests),
        sources_section(manifests, statuses),
        environment_section(environment()),
        figures_section(manifests),
    ])
    path = out_dir / "REPORT.md"
    path.write_text(text)
    return path
