"""The docs site (docs/, Sphinx + MyST) builds with warnings as errors, as `make docs` and CI build it: a broken
link or anchor, a page left out of the table of contents, a docstring reStructuredText cannot read fail here.

The quick test reads every page and docstring and resolves every reference (Sphinx's `dummy` builder writes no
files); the slow one writes the HTML site itself."""

import re
import subprocess
import sys

import pytest

from tests import docs_pages
from tests.conftest import PACKAGE, ROOT


def sphinx_build(builder: str, out) -> str:
    """`sphinx-build -W --keep-going` of docs/ into `out`; its output, after checking that it passed."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "docs", str(out)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    warnings = [line for line in output.splitlines() if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)]
    assert run.returncode == 0 and not warnings, "\n".join(warnings) or output[-3000:]
    return output


def modules() -> set[str]:
    """Every module of the package by its dotted name (a package by its own), as the API reference lists them."""
    names = set()
    for path in (ROOT / PACKAGE).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] != "__main__":
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_page_and_docstring_reads_without_a_warning(tmp_path):
    sphinx_build("dummy", tmp_path / "out")
    # The API pages are made at every build, one per module: none missing, none left from a module gone.
    assert {p.stem for p in (docs_pages.DOCS / "api").glob("*.rst")} == modules()


@pytest.mark.slow
def test_the_site_builds_without_a_warning(tmp_path):
    out = tmp_path / "html"
    sphinx_build("html", out)
    for page in docs_pages.PAGES[1:]:  # every docs page is in the site (the README is the repository's)
        assert (out / page.with_suffix(".html").name).is_file(), page.name
    assert len(list((out / "api").glob("*.html"))) == len(modules())
    # The benchmarks page holds benchmarks/README.md itself, not a link to it.
    assert "Photo recipes" in (out / "benchmarks.html").read_text()


def test_the_check_fails_on_a_page_with_a_broken_link(tmp_path, monkeypatch):
    """The build fails on a warning: a page linking to an anchor no page has, in a copy of the docs."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(docs_pages.DOCS, copy / "docs", ignore=shutil.ignore_patterns("api"))
    (copy / "docs" / "security.md").write_text("# Security\n\nSee [nothing](data.md#no-such-section).\n")
    (copy / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "README.md", copy / "benchmarks" / "README.md")
    (copy / PACKAGE).mkdir()
    (copy / PACKAGE / "__init__.py").write_text('"""A package."""\n')
    (copy / PACKAGE / "__main__.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", copy)
    with pytest.raises(AssertionError, match="no-such-section"):
        sphinx_build("dummy", tmp_path / "out")
