"""The pages users read (the README and the docs site's Markdown pages) and the commands on them.

The tests that run documented commands read them here, so a command moved from one page to another stays
tested; tests/test_readme.py fails on a command in a shell block that none of them runs.
"""

import re
from pathlib import Path

from tests.conftest import ROOT

DOCS = ROOT / "docs"
#: Every page, the README first.
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
SHELL_FENCES = ("```bash", "```sh", "```shell", "```console")


def text() -> str:
    """All pages, one after another."""
    return "\n".join(page.read_text() for page in PAGES)


def lines() -> list[str]:
    """Every line of every page, stripped, with a trailing `&` (a command sent to the background) taken off."""
    return [line.strip().rstrip("&").strip() for line in text().splitlines()]


def without_comment(line: str) -> str:
    """The command before its `  # comment` (two spaces, as the pages write them)."""
    return line.split("  #")[0].strip()


def cli_commands(*parts: str) -> list[str]:
    """The `python -m project ...` lines of every page (comments cut off), those naming one of `parts` if given."""
    commands = [without_comment(line) for line in lines() if line.startswith("python -m project ")]
    return [c for c in commands if not parts or any(p in c for p in parts)]


def shell_lines() -> list[tuple[str, str]]:
    """(page, command) for every line of every shell block (```bash) on every page, comments cut off."""
    found = []
    for page in PAGES:
        inside = False
        for line in page.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith("```"):
                inside = not inside and stripped in SHELL_FENCES
                continue
            command = re.sub(r"\s+#(\s.*)?$", "", stripped).rstrip("&").strip()  # the shell's comment cut off
            if inside and command and not command.startswith("#"):
                found.append((page.relative_to(ROOT).as_posix(), command))
    return found


def section(page: Path, heading: str) -> str:
    """The text of `## heading` on a page, up to the next heading of its level."""
    body = page.read_text()
    start = body.index(f"\n## {heading}\n")
    end = body.find("\n## ", start + 1)
    return body[start : end if end != -1 else len(body)]
