"""Code, docs and notebooks describe the kit as it is; its history lives in git. None of them may
mention a tracker issue, a working session or an earlier state of the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = [("relibra", "*.py"), ("tests", "*.py"), ("scripts", "*"), ("docs", "*.md"), ("notebooks", "*.py"),
           ("notebooks", "*.ipynb"), ("data", "*.md"), (".", "README.md"), (".", "reproduce.sh")]
# Each pattern is written so that it does not match its own source text.
FORBIDDEN = re.compile(r"\bissues?\s+#?\d+|\bthis\s+session|\bearlier\s+(?:version|port|implementation|revision)s?\b"
                       r"|\bbefore\s+this\s+change|\bthis\s+revision\b|\bas\s+it\s+stood\b|\bused\s+to\s+be\b",
                       re.IGNORECASE)


def scanned_files() -> list[Path]:
    files = []
    for folder, pattern in SCANNED:
        base = ROOT / folder
        found = base.glob(pattern) if folder == "." else base.rglob(pattern)
        files += [p for p in found if p.is_file() and ".ipynb_checkpoints" not in p.parts]
    return sorted(files)


def test_no_history_wording_in_code_docs_or_notebooks():
    files = scanned_files()
    assert any(p.suffix == ".md" for p in files) and any(p.suffix == ".py" for p in files)
    hits = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            match = FORBIDDEN.search(line)
            if match:
                hits.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert hits == [], "history wording (git holds the history):\n" + "\n".join(hits)


def test_the_pattern_catches_each_phrase():
    # phrases kept as word tuples, so that this file passes its own scan
    caught = [("see", "Issue", "14"), ("issues", "11", "and", "15"), ("issue", "#3"), ("in", "this", "session"),
              ("the", "earlier", "version"), ("the", "kit's", "earlier", "port"), ("an", "earlier", "implementation"),
              ("Before", "this", "change"), ("Until", "this", "revision"), ("the", "generator", "as", "it", "stood"),
              ("it", "used", "to", "be", "slower")]
    for words in caught:
        assert FORBIDDEN.search(" ".join(words)), words
    for text in ("an issue with 3 ranks", "the session's trace", "a version earlier than 2.0", "earlier steps",
                 "the git revision", "as it stands, the plan", "the trace used to benchmark", "used to beat"):
        assert not FORBIDDEN.search(text), text
