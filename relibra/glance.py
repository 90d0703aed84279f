"""The README's "Results at a glance" table, built from what a reproduction run wrote, never typed.

`write_glance(out)` reads back the facts (facts.csv) of every notebook under `out` (default results/)
and writes `out/glance.md`: one markdown table of the facts with a `readme` title, columns what | figure |
how it was obtained (simulated or measured, on what, at which profile). A notebook that has not run adds
no row; a result missing a table is an error naming the file.

`relibra reproduce` writes it after REPORT.md; `relibra reproduce --update-readme` also copies it to
docs/glance.md and puts it between the README's `<!-- table:glance begin -->` and `<!-- table:glance end -->`
markers (`update_readme`, through the kit's one marker mechanism, relibra.display.with_blocks), so the
README's numbers are those of the last full run.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from relibra.display import marked_blocks, marker, with_blocks
from relibra.errors import ConfigError
from relibra.experiments.registry import NOTEBOOK_MODULES, in_shown_order, load_results
from relibra.experiments.text import fact_rows
from relibra.paths import write_text
from relibra.report import md_table

BEGIN, END = marker("glance", "begin"), marker("glance", "end")
HEADER = ("<!-- written by `relibra reproduce` (relibra/glance.py) from the results under {out}/; "
          "do not edit: run `./reproduce.sh --update-readme` -->")


def glance_notebooks() -> list[str]:
    """The notebooks whose facts may give README rows: every one (its facts with a `readme` title)."""
    return list(NOTEBOOK_MODULES)


def glance_rows(out_dir: str | Path) -> pd.DataFrame:
    """Every README row of the notebooks present under out_dir (their facts with a `readme` title, rendered by
    relibra.experiments.text.fact_rows): columns what, figure, how it was obtained."""
    rows = [row for x in in_shown_order(load_results(out_dir).values()) for row in fact_rows(x.facts)]
    hows = [row["how it was obtained"] for row in rows]
    for i in range(1, len(rows)):  # a "how" repeated from the row above reads "same as above"
        if hows[i] == hows[i - 1]:
            rows[i]["how it was obtained"] = "same as above"
    return pd.DataFrame(rows, columns=["what", "figure", "how it was obtained"])


def glance_markdown(out_dir: str | Path) -> str:
    """The glance file's text: a header comment and the table (or a line saying nothing has run)."""
    rows = glance_rows(out_dir)
    body = md_table(rows) if len(rows) else f"No reproduction results under {out_dir} yet: run ./reproduce.sh."
    return f"{HEADER.format(out=Path(out_dir).as_posix().rstrip('/'))}\n{body}\n"


def write_glance(out_dir: str | Path) -> Path:
    """Write <out_dir>/glance.md (see the module docstring); returns its path."""
    path = Path(out_dir) / "glance.md"
    write_text(path, glance_markdown(out_dir))
    return path


def readme_block(text: str, where: str = "README.md") -> str:
    """The text of the glance block of `text` (between its marker lines)."""
    found = [(start, end) for name, start, end in marked_blocks(text, where) if name == "glance"]
    if len(found) != 1:
        raise ConfigError(f"{where}: needs exactly one '{BEGIN}' line followed by one '{END}' line around the "
                          "results table")
    return text[found[0][0]:found[0][1]]


def replace_block(text: str, block: str, where: str = "README.md") -> str:
    """`text` with the glance block replaced by `block` (which ends with a newline)."""
    readme_block(text, where)  # checks the markers
    return with_blocks(text, lambda name, current: block if name == "glance" else current, where)


def update_readme(glance: str | Path, readme: str | Path, docs_copy: str | Path) -> None:
    """Copy the glance file to docs_copy (committed) and put its text between the README's markers."""
    glance, readme, docs_copy = Path(glance), Path(readme), Path(docs_copy)
    block = glance.read_text()
    if not block.endswith("\n"):
        block += "\n"
    text = replace_block(readme.read_text(), block, str(readme))
    docs_copy.parent.mkdir(parents=True, exist_ok=True)
    write_text(docs_copy, block)
    write_text(readme, text)
