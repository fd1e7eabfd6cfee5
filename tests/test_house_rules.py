"""House rules a reader relies on: comments explain why and leave figures to benchmarks/README.md (a figure
quoted in code goes stale the day it is measured again), and importing the package changes nothing."""

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from tests.conftest import PACKAGE, ROOT

#: A benchmarks section by number, or a measured speed factor or share: what benchmarks/README.md holds.
QUOTED_FIGURE = re.compile(
    r"\bsection \d+|~\d+(\.\d+)?x\b|\b\d+(\.\d+)?x (faster|slower)\b|\bbenchmarks/README\.md,? §"
)


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string standing alone as a statement (docstrings)."""
    if path.suffix == ".yaml":
        return [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if "#" in line]
    found, previous = [], None
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if (
            token.type == tokenize.COMMENT
            or token.type == tokenize.STRING
            and previous
            in (
                tokenize.INDENT,
                tokenize.NEWLINE,
                tokenize.DEDENT,
                None,
            )
        ):
            found.append((token.start[0], token.string))
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token.type
    return found


SOURCES = sorted([*(ROOT / PACKAGE).rglob("*.py"), *(ROOT / "configs").rglob("*.yaml")])


def test_the_rule_sees_a_quoted_figure(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Fast: see benchmarks/README.md section 4."""\n\nx = 1  # numpy is ~20x faster here\n'
    )
    assert [n for n, text in comments_and_docstrings(sample) if QUOTED_FIGURE.search(text)] == [1, 3]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_comments_quote_no_figure_or_benchmarks_section(path):
    quoted = [
        f"{n}: {text.strip()[:100]}"
        for n, text in comments_and_docstrings(path)
        if QUOTED_FIGURE.search(text)
    ]
    assert quoted == [], (
        f"{path.relative_to(ROOT)}: leave the figure to benchmarks/README.md and say why instead"
    )


def test_importing_the_cli_changes_no_global_state():
    """Importing is free of side effects: warning filters and logging handlers are set by the command that
    runs (`main`), so a script or notebook that imports the CLI keeps its own."""
    code = (
        "import logging, warnings\n"
        # The libraries' own import-time filters are theirs: imported first, so only the package's show.
        "import torch, torchvision, lightning.pytorch, jsonargparse, torchmetrics\n"
        "filters, handlers = list(warnings.filters), {n: list(l.handlers) for n, l in logging.root.manager.loggerDict.items() if isinstance(l, logging.Logger)}\n"
        f"import {PACKAGE}.cli, {PACKAGE}.errors\n"
        "assert warnings.filters == filters, [f for f in warnings.filters if f not in filters]\n"
        "after = {n: [h for h in getattr(l, 'handlers', []) for f in getattr(h, 'filters', [])] for n, l in logging.root.manager.loggerDict.items() if isinstance(l, logging.Logger)}\n"
        "assert not any(after.values()), after\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
