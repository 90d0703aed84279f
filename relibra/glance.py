"""The README's "Results at a glance" table, built from what a reproduction run wrote, never typed: the facts
with a `readme` title of every notebook under `out` (facts.csv), one row each: what | figure | how it was
obtained. `relibra reproduce` writes it to out/glance.md; `--update-readme` also copies it to docs/glance.md and
puts it between the README's `<!-- table:glance begin/end -->` markers (relibra.display's marker mechanism).
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
    """The notebooks whose facts may give README rows: every one."""
    return list(NOTEBOOK_MODULES)


def glance_rows(out_dir: str | Path) -> pd.DataFrame:
    """Every README row of the notebooks present under out_dir: columns what, figure, how it was obtained (a
    "how" repeated from the row above reads "same as above")."""
    rows = pd.DataFrame([row for x in in_shown_order(load_results(out_dir).values()) for row in fact_rows(x.facts)],
                        columns=["what", "figure", "how it was obtained"])
    how = rows["how it was obtained"]
    rows["how it was obtained"] = how.mask(how.eq(how.shift()), "same as above")
    return rows


def glance_markdown(out_dir: str | Path) -> str:
    """The glance file's text: a header comment and the table (or a line saying nothing has run)."""
    rows = glance_rows(out_dir)
    body = md_table(rows) if len(rows) else f"No reproduction results under {out_dir} yet: run ./reproduce.sh."
    return f"{HEADER.format(out=Path(out_dir).as_posix().rstrip('/'))}\n{body}\n"


def write_glance(out_dir: str | Path) -> Path:
    """Write <out_dir>/glance.md; returns its path."""
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
    block = Path(glance).read_text().removesuffix("\n") + "\n"
    text = replace_block(Path(readme).read_text(), block, str(readme))
    Path(docs_copy).parent.mkdir(parents=True, exist_ok=True)
    write_text(Path(docs_copy), block)
    write_text(Path(readme), text)
