"""The docs site (docs/, Sphinx + MyST) builds with warnings as errors, as `make docs` and CI build it: a broken
link or anchor, a page left out of the table of contents, a docstring reStructuredText cannot read fail here.

The quick test reads every page and docstring and resolves every reference (Sphinx's `dummy` builder writes no
files); the slow one writes the HTML site itself. Each builds a copy of docs/ of its own (the package and
benchmarks/ linked in), so builds running at once never share the API pages a build generates."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs_pages
from tests.conftest import PACKAGE, ROOT


def docs_copy(folder: Path, package: Path = ROOT / PACKAGE) -> Path:
    """A repository of the docs alone in `folder`: docs/ copied (without its generated API pages), the package
    and benchmarks/ linked; returns its docs folder."""
    shutil.copytree(docs_pages.DOCS, folder / "docs", ignore=shutil.ignore_patterns("api", "__pycache__"))
    (folder / "benchmarks").symlink_to(ROOT / "benchmarks")
    (folder / PACKAGE).symlink_to(package)
    return folder / "docs"


def sphinx_build(docs: Path, builder: str, out: Path) -> str:
    """`sphinx-build -W --keep-going` of `docs` into `out`; its output, after checking that it passed."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, str(docs), str(out)]
    run = subprocess.run(command, cwd=docs.parent, capture_output=True, text=True, timeout=900)
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


@pytest.mark.slow
def test_every_page_and_docstring_reads_without_a_warning(tmp_path):
    docs = docs_copy(tmp_path / "repo")
    sphinx_build(docs, "dummy", tmp_path / "out")
    # The API pages are made at every build, one per module: none missing, none left from a module gone.
    assert {p.stem for p in (docs / "api").glob("*.rst")} == modules()


@pytest.mark.slow
def test_the_site_builds_without_a_warning(tmp_path):
    out = tmp_path / "html"
    sphinx_build(docs_copy(tmp_path / "repo"), "html", out)
    for page in docs_pages.PAGES[1:]:  # every docs page is in the site (the README is the repository's)
        assert (out / page.with_suffix(".html").name).is_file(), page.name
    assert len(list((out / "api").glob("*.html"))) == len(modules())
    # The benchmarks page holds benchmarks/README.md itself, not a link to it.
    assert "Photo recipes" in (out / "benchmarks.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path):
    """A page linking to a section no page has, in a copy of the docs over a package of one module."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "__main__.py").write_text("")
    docs = docs_copy(tmp_path / "repo", package)
    (docs / "security.md").write_text("# Security\n\nSee [nothing](data.md#no-such-section).\n")
    with pytest.raises(AssertionError, match="no-such-section"):
        sphinx_build(docs, "dummy", tmp_path / "out")
