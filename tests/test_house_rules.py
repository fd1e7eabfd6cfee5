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
    sample.write_text('"""Fast: see the benchmarks, section 4."""\n\nx = 1  # numpy is ~20x faster here\n')
    assert [n for n, text in comments_and_docstrings(sample) if QUOTED_FIGURE.search(text)] == [1, 3]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_comments_quote_no_figure_or_benchmarks_section(path):
    quoted = [
        f"{n}: {text.strip()[:100]}"
        for n, text in comments_and_docstrings(path)
        if QUOTED_FIGURE.search(text)
    ]
    assert quoted == [], f"{path.relative_to(ROOT)}: leave the figure to the benchmarks and say why instead"


#: Run in a fresh interpreter from an empty folder: the libraries the package imports are imported first (their
#: own import-time set-up is theirs), then every module of the package, one at a time, each compared with the
#: process's state before it.
IMPORT_EVERY_MODULE = """
import ast, gc, importlib, logging, os, pkgutil, signal, sys, threading, warnings
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[1])
package = importlib.import_module(sys.argv[2])
folder = Path(package.__path__[0])
libraries = set()
for path in folder.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            libraries |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            libraries.add(node.module)
for name in sorted(n for n in libraries if n.partition(".")[0] != package.__name__):
    try:
        importlib.import_module(name)
    except Exception:  # an optional extra that is not installed, or a name that is not a module
        pass

def state():
    loggers = [("", logging.root)] + [(n, l) for n, l in logging.root.manager.loggerDict.items() if isinstance(l, logging.Logger)]
    return {
        "warning filters": list(warnings.filters),
        "logging": {n: (list(l.handlers), list(l.filters), l.level) for n, l in loggers},
        "signal handlers": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)},
        "environment": dict(os.environ),
        "working directory": os.getcwd(),
        "garbage collector": gc.isenabled(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "torch matmul precision": torch.get_float32_matmul_precision(),
        "hooks": (sys.excepthook, warnings.showwarning, sys.displayhook),
    }

changed = []
for module in sorted(m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")):
    before = state()
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:  # a part whose extra is not installed: nothing of it ran
        if (e.name or "").partition(".")[0] == package.__name__:
            raise
        continue
    after = state()
    changed += [f"{module}: {what}" for what in before if before[what] != after[what]]
print("CHANGED", changed)
print("WRITTEN", sorted(os.listdir(".")))
"""


def test_importing_any_module_changes_no_global_state(tmp_path):
    """Importing is free of side effects: warning filters, logging handlers, signal handlers and the like are
    set by the command that runs (`main`, a command function), so a script, notebook or test that imports any
    part of the package keeps its own, and nothing is written."""
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE, str(ROOT), PACKAGE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(
        line.split(" ", 1) for line in run.stdout.splitlines() if line.startswith(("CHANGED", "WRITTEN"))
    )
    assert lines == {"CHANGED": "[]", "WRITTEN": "[]"}, run.stdout[-3000:]


def test_the_import_check_sees_a_side_effect(tmp_path):
    package = tmp_path / "sample"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "noisy.py").write_text("import warnings\nwarnings.filterwarnings('ignore', message='x')\n")
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE, str(tmp_path), "sample"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "CHANGED ['sample.noisy: warning filters']" in run.stdout, run.stdout + run.stderr[-2000:]
