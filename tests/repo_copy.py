"""A copy of the repository's files to change (rename the package, delete a part) and run, and the parts list.

The copy holds what git would: the tracked files and the new ones not ignored, as they are in the working tree
(no caches, logs, data or virtual environment). It is run with PYTHONPATH pointing at it, with no install.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pathspec
import yaml

from tests.conftest import ROOT

#: The optional parts present: name -> {"summary", "commands", "extras", "files"} (parts.yaml says what each
#: field means). A project made without some parts lists only the ones it has.
PARTS: dict[str, dict] = yaml.safe_load((ROOT / "parts.yaml").read_text()) or {}


def repository_files() -> list[str]:
    """The repository's files as git sees them (tracked, and new ones not ignored), relative to the root. A
    project just made from the template is no git repository yet: there, every file that .gitignore does not
    ignore (pathspec reads it as git does)."""
    if (ROOT / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.split("\0")  # fmt: skip
        return sorted(name for name in set(listed) if name and (ROOT / name).is_file())
    ignore_file = ROOT / ".gitignore"
    ignored = pathspec.GitIgnoreSpec.from_lines(
        ignore_file.read_text().splitlines() if ignore_file.is_file() else []
    )
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        where = Path(folder).relative_to(ROOT)
        subfolders[:] = [s for s in subfolders if not ignored.match_file(f"{(where / s).as_posix()}/")]
        found += [(where / n).as_posix() for n in names if not ignored.match_file((where / n).as_posix())]
    return sorted(found)


def copy_repository(destination: Path) -> Path:
    """The repository's files copied under `destination`, which is returned."""
    for name in repository_files():
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, destination / name)
    return destination


def glob_pattern(pattern: str) -> re.Pattern[str]:
    """A parts.yaml glob as a regular expression over `/`-separated paths: `**` any depth, `*` and `?` within
    one name."""
    regex = re.sub(
        r"\*\*|\*|\?|[^*?]+",
        lambda m: {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(m.group(0), re.escape(m.group(0))),
        pattern,
    )
    return re.compile(regex)


def part_files(part: str, files: list[str]) -> list[str]:
    """Those of `files` (relative paths) that belong to `part`."""
    patterns = [glob_pattern(p) for p in PARTS[part]["files"]]
    return [name for name in files if any(p.fullmatch(name) for p in patterns)]


def part_is_present(part: str) -> bool:
    """Whether any file of `part` is in the checkout (read from the disk: a copy may have no git)."""
    return any(any(ROOT.glob(pattern)) for pattern in PARTS[part]["files"])


def delete_part(part: str, copy: Path) -> list[str]:
    """Deletes the files of `part` from `copy` (and the folders left empty) and the lines marked as the part's
    in the files that remain; returns the files deleted."""
    files = [str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()]
    doomed = part_files(part, files)
    for name in doomed:
        (copy / name).unlink()
    for folder in sorted({(copy / name).parent for name in doomed}, key=lambda p: -len(p.parts)):
        while folder != copy and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    for name in sorted(set(files) - set(doomed)):
        try:
            text = (copy / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if (kept := without_part_blocks(text, part)) != text:
            (copy / name).write_text(kept, encoding="utf-8")
    return doomed


def part_blocks(part: str) -> re.Pattern[str]:
    """The lines a file shares with `part`: from a line `# part: <part>` to `# /part: <part>` (code, configs,
    scripts), or from `<!-- part: <part> -->` to `<!-- /part: <part> -->` (Markdown), with the blank lines after
    a block that has blank lines before it."""
    name = re.escape(part)
    start, end = (
        rf"(?:#\s*part: {name}|<!-- part: {name} -->)",
        rf"(?:#\s*/part: {name}|<!-- /part: {name} -->)",
    )
    return re.compile(rf"^[ \t]*{start}[ \t]*\n.*?^[ \t]*{end}[ \t]*(?:\n|\Z)((?:[ \t]*\n)*)", re.M | re.S)


def without_part_blocks(text: str, part: str) -> str:
    """`text` without the lines it shares with `part` (what template/render.py removes from a project made
    without the part)."""
    kept = part_blocks(part).sub(
        lambda m: "" if m.start() == 0 or text[: m.start()].endswith("\n\n") else m.group(1), text
    )
    return kept.rstrip("\n") + "\n" if kept != text and kept.endswith("\n\n") else kept


def run_in(
    copy: Path, *args: object, shadow: Path | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """`python <args>` run in `copy`, importing from it; the folder `shadow`, if given, comes first on the path."""
    environment = {**os.environ, "COLUMNS": "200"}
    environment["PYTHONPATH"] = os.pathsep.join(str(p) for p in (shadow, copy) if p)
    environment.pop("WANDB_SERVICE", None)
    return subprocess.run(
        [sys.executable, *map(str, args)], cwd=copy, env=environment, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
