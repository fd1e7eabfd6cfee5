"""Finishes a project made from the template: the parts chosen, the package under its name, the pins it needs.

copier runs this (the task in copier.yml) in the destination after every render: after `copier copy`, and after
each of the three renders `copier update` makes (the template's old version and its new one in scratch folders,
and the project itself). All three are finished alike, so the difference copier carries over from the old
render to the project holds the user's own changes alone. copier has already left out the files of the parts
not chosen (copier.yml's `_exclude`, read from parts.yaml); this does what a list of files cannot:

- in every file, the lines marked as a part's (`# part: NAME` to `# /part: NAME`, `<!-- part: NAME -->` in
  Markdown) go with it: its extras in pyproject.toml, its default callbacks, its docs sections;
- constraints.txt: only the pins that the remaining requirements reach (through the lock's `# via` lines);
- parts.yaml: only the parts present, each listing only files present (a file two parts share goes with either,
  so a part kept no longer lists it); the docs' table-of-contents lines naming a page that is not there;
- pyproject.toml: the author;
- the package renamed: its folder, and every reference to it in the template's files (imports, dotted paths in
  configs, `python -m` launches, file paths, the distribution's name);
- the project's name in README.md's title and the docs' settings.

Only the template's own files are read or written: a file the user added is never touched. Running it again on
its own result changes nothing.

    python template/render.py --template TEMPLATE --package NAME --parts a,b [--name ...] [--author ...]
"""

import argparse
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: Where the lock's tool pins come from (the Makefile's constraints target): kept whatever the parts.
TOOLS_SOURCE = "-r build/tools.in"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--template", type=Path, required=True, help="the template's folder (copier's src_path)"
    )
    parser.add_argument(
        "--destination", type=Path, default=Path.cwd(), help="the rendered project (default: .)"
    )
    parser.add_argument("--package", required=True, help="the package's import name")
    parser.add_argument(
        "--parts", default="", help="the parts chosen, comma-separated ('' for the core alone)"
    )
    parser.add_argument("--name", default="", help="the project's name (README.md's title, the docs' title)")
    parser.add_argument("--author", default="", help="the author's name")
    parser.add_argument("--email", default="", help="the author's e-mail address")
    args = parser.parse_args(argv)
    finish(
        args.template.resolve(),
        args.destination.resolve(),
        package=args.package,
        chosen={p for p in args.parts.split(",") if p},
        name=args.name,
        author=args.author,
        email=args.email,
    )


def finish(
    template: Path,
    project: Path,
    *,
    package: str,
    chosen: set[str],
    name: str = "",
    author: str = "",
    email: str = "",
) -> None:
    parts = yaml.safe_load((template / "parts.yaml").read_text(encoding="utf-8"))
    unknown = chosen - set(parts)
    if unknown:
        sys.exit(
            f"error: no part named {', '.join(sorted(unknown))} in parts.yaml (the parts: {', '.join(parts)})"
        )
    absent = [p for p in parts if p not in chosen]
    old_package = template_package(template)
    files = [f for f in template_files(template) if (project / f).is_file()]

    for file in files:
        edit(project / file, lambda t: without_part_blocks(t, absent))
    edit(project / "parts.yaml", lambda t: without_parts(t, absent))
    edit(project / "parts.yaml", lambda t: without_patterns_of_files_left_out(t, files))
    for file in files:
        if file.endswith(".md"):
            edit(
                project / file, lambda t, folder=(project / file).parent: toctree_of_pages_present(t, folder)
            )
    if author:
        edit(project / "pyproject.toml", lambda t: with_author(t, author, email))
    roots = requirement_names(project / "pyproject.toml")  # the parts' extras are gone with their blocks
    edit(project / "constraints.txt", lambda t: trimmed_lock(t, roots))
    if name:
        edit(project / "README.md", lambda t: re.sub(r"\A# .*", lambda _: f"# {name}", t))
        edit(project / "docs/conf.py", lambda t: docs_settings(t, name, author))
    if package != old_package:
        rename(project, files, old_package, package)
    remove_empty_folders(project, template)


def template_package(template: Path) -> str:
    """The template's package: what pyproject.toml packages (`include = ["<package>*"]`)."""
    text = (template / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^include = \["([A-Za-z_][A-Za-z0-9_]*)\*"\]', text, re.M)
    if found is None:
        sys.exit('error: the template\'s pyproject.toml has no `include = ["<package>*"]` line')
    return found.group(1)


def template_files(template: Path) -> list[str]:
    """The template's files, relative to its folder, as `/`-separated paths (its .git left out)."""
    found = []
    for folder, subfolders, names in os.walk(template):
        subfolders[:] = [s for s in subfolders if s != ".git"]
        found += [(Path(folder) / n).relative_to(template).as_posix() for n in names]
    return sorted(found)


def edit(path: Path, change) -> None:
    """Rewrites the text file `path` through `change` where it is there, is text and changes."""
    if not path.is_file():
        return
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return
    changed = change(text)
    if changed != text:
        path.write_text(changed, encoding="utf-8")


# -- pyproject.toml ------------------------------------------------------------------------------------------


def array_end(text: str, start: int) -> int:
    """Where the TOML array opening at `text[start]` ends: past its closing bracket, its line's comment and
    newline (brackets inside strings, as in `"moto[s3]>=5.0"`, do not count)."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c == "#":
            i = text.index("\n", i) - 1
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return text.index("\n", i) + 1
        i += 1
    raise ValueError(f"pyproject.toml: an array opened at offset {start} does not close")


def with_author(text: str, author: str, email: str) -> str:
    """pyproject.toml with `authors` naming `author` (and `email`), after the `license` line."""
    person = f"name = {toml_string(author)}" + (f", email = {toml_string(email)}" if email else "")
    line = f"authors = [{{ {person} }}]\n"
    if re.search(r"^authors = .*\n", text, re.M):
        return re.sub(r"^authors = .*\n", lambda _: line, text, count=1, flags=re.M)
    return re.sub(r"^(license = .*\n)", lambda m: m.group(1) + line, text, count=1, flags=re.M)


def toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def requirement_names(path: Path) -> set[str]:
    """The names of every requirement in pyproject.toml's dependencies and extras (the closure's roots). Read
    without a TOML parser (the Python running copier may predate tomllib): the arrays of `dependencies` in
    `[project]` and of every key in `[project.optional-dependencies]`, comments left out."""
    text = path.read_text(encoding="utf-8")
    tables = [(m.group(1), m.end()) for m in re.finditer(r"^\[([^\]\n]+)\][ \t]*$", text, re.M)]
    names = set()
    for (table, start), (_, end) in zip(tables, [*tables[1:], ("", len(text))], strict=True):
        keys = {"project": r"dependencies", "project.optional-dependencies": r"[A-Za-z0-9_.-]+"}.get(table)
        for array in re.finditer(rf"^(?:{keys}) = (?=\[)", text[start:end], re.M) if keys else ():
            opening = start + array.end()
            values = re.sub(r"#[^\n]*", "", text[opening : array_end(text, opening)])
            names |= {canonicalize_name(Requirement(r).name) for r in re.findall(r'"([^"]+)"', values)}
    return names


# -- constraints.txt -------------------------------------------------------------------------------------------


def trimmed_lock(text: str, roots: set[str]) -> str:
    """The lock with only the pins that `roots` reach through its `# via` lines (and the tools' pins), and the
    `# via` lines naming only pins that stay."""
    header, blocks = lock_blocks(text)
    needs: dict[str, set[str]] = {}  # package -> the packages that require it
    for block in blocks:
        needs.setdefault(block.name, set()).update(block.via)
    required_by: dict[str, set[str]] = {}
    for package, parents in needs.items():
        for parent in parents:
            required_by.setdefault(parent, set()).add(package)
    kept = {name for name, parents in needs.items() if TOOLS_SOURCE in parents} | (roots & set(needs))
    todo = list(kept)
    while todo:
        for child in required_by.get(todo.pop(), ()):
            if child not in kept:
                kept.add(child)
                todo.append(child)
    return header + "".join(block.text(kept) for block in blocks if block.name in kept)


class LockBlock:
    """One pin of the lock: its requirement and hash lines, and the packages its `# via` lines name."""

    def __init__(self, lines: list[str]):
        self.pin = [line for line in lines if not line.lstrip().startswith("#")]
        self.name = canonicalize_name(re.split(r"[=<>~!; \[]", self.pin[0], maxsplit=1)[0])
        self.via = []
        for line in lines:
            entry = re.sub(r"^\s*#\s*(via\b)?\s*", "", line).strip() if line.lstrip().startswith("#") else ""
            if entry:
                self.via.append(entry if entry.startswith("-") or " " in entry else canonicalize_name(entry))

    def text(self, kept: set[str]) -> str:
        """The block, its `# via` lines naming only the packages in `kept` (and the project or a file)."""
        via = [v for v in self.via if v in kept or v.startswith("-") or " " in v]
        return "".join([*self.pin, *(["    # via\n", *(f"    #   {v}\n" for v in via)] if via else [])])


def lock_blocks(text: str) -> tuple[str, list[LockBlock]]:
    """The lock's header comment and its pins."""
    lines = text.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line[:1].isalnum()), len(lines))
    blocks: list[list[str]] = []
    for line in lines[first:]:
        if line[:1].isalnum():
            blocks.append([line])
        elif line.strip():
            blocks[-1].append(line)
    return "".join(lines[:first]), [LockBlock(b) for b in blocks]


# -- parts.yaml and Markdown -----------------------------------------------------------------------------------


def without_parts(text: str, absent: Iterable[str]) -> str:
    """parts.yaml without the entries of the parts `absent` (each from its key to the next top-level line)."""
    for part in absent:
        text = re.sub(rf"^{re.escape(part)}:\n(?:(?:[ \t][^\n]*)?\n)*", "", text, count=1, flags=re.M)
    return text


def without_patterns_of_files_left_out(text: str, files: Iterable[str]) -> str:
    """parts.yaml without the file patterns (`    - PATTERN` lines) that match none of `files`: a file two parts
    share goes with either, so a part kept stops listing the file a part left out took along."""
    files = list(files)

    def kept(line: re.Match) -> str:
        pattern = glob_pattern(line.group(1))
        return line.group(0) if any(pattern.fullmatch(f) for f in files) else ""

    return re.sub(r"^[ \t]+- (\S+)[ \t]*\n", kept, text, flags=re.M)


def glob_pattern(pattern: str) -> re.Pattern[str]:
    """A parts.yaml glob as a regular expression over `/`-separated paths: `**` any depth, `*` and `?` within
    one name. (tests/repo_copy.py reads them the same way; this script runs without the project.)"""
    regex = re.sub(
        r"\*\*|\*|\?|[^*?]+",
        lambda m: {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(m.group(0), re.escape(m.group(0))),
        pattern,
    )
    return re.compile(regex)


def without_part_blocks(text: str, absent: Iterable[str]) -> str:
    """`text` without the lines it shares with the parts `absent`: from a line `# part: NAME` to `# /part: NAME`
    (code, configs, scripts), or from `<!-- part: NAME -->` to `<!-- /part: NAME -->` (Markdown), the markers
    included. A block with blank lines before it takes the blank lines after it along, so the lines around it
    stay spaced as they were. (tests/repo_copy.py removes them the same way when a part is deleted by hand.)"""
    for part in absent:
        name = re.escape(part)
        start, end = (
            rf"(?:#\s*part: {name}|<!-- part: {name} -->)",
            rf"(?:#\s*/part: {name}|<!-- /part: {name} -->)",
        )
        block = re.compile(
            rf"^[ \t]*{start}[ \t]*\n.*?^[ \t]*{end}[ \t]*(?:\n|\Z)((?:[ \t]*\n)*)", re.M | re.S
        )
        kept = block.sub(
            lambda m, t=text: "" if m.start() == 0 or t[: m.start()].endswith("\n\n") else m.group(1), text
        )
        text = kept.rstrip("\n") + "\n" if kept != text and kept.endswith("\n\n") else kept
    return text


def toctree_of_pages_present(text: str, folder: Path) -> str:
    """Markdown whose `{toctree}` blocks list only the pages present (a page of a part left out goes)."""

    def present(block: re.Match) -> str:
        lines = block.group(2).splitlines(keepends=True)
        kept = [
            line
            for line in lines
            if not line.strip()
            or line.lstrip().startswith(":")
            or "*" in line  # a glob (`:glob:`)
            or any((folder / f"{line.strip()}{suffix}").is_file() for suffix in ("", ".md", ".rst"))
        ]
        return block.group(1) + "".join(kept) + block.group(3)

    return re.sub(r"(^```\{toctree\}[^\n]*\n)(.*?)(^```)", present, text, flags=re.M | re.S)


def docs_settings(text: str, name: str, author: str) -> str:
    """docs/conf.py naming the project (its `project` and `html_title`) and, where given, its author."""
    text = re.sub(
        r'^(project|html_title) = ".*"$', lambda m: f"{m.group(1)} = {toml_string(name)}", text, flags=re.M
    )
    if author:
        text = re.sub(
            r'^(author|copyright) = ".*"$',
            lambda m: f"{m.group(1)} = {toml_string(author)}",
            text,
            flags=re.M,
        )
    return text


# -- the package's name ----------------------------------------------------------------------------------------


def renamed(text: str, old: str, new: str) -> str:
    """`text` with its references to the package `old` naming `new`: imports, dotted paths (`old.models.X`, not
    `[old.optional-dependencies]`), `-m old` launches, `old/` paths, pyproject.toml's distribution name and
    package list, and a line naming the package alone (a Sphinx autosummary list)."""
    o = re.escape(old)
    text = re.sub(rf"\b(import|from) {o}\b", lambda m: f"{m.group(1)} {new}", text)
    text = re.sub(rf"(?<![\w\[./-]){o}\.(?=[A-Za-z_])", f"{new}.", text)
    text = re.sub(rf"(?<![\w.-])-m {o}\b", f"-m {new}", text)
    text = re.sub(rf"""(["']-m["'],\s*["']){o}(["'])""", rf"\g<1>{new}\g<2>", text)  # ["-m", "<package>"]
    text = re.sub(
        rf"^(\s*- -m\n\s*- ){o}$", rf"\g<1>{new}", text, flags=re.M
    )  # a YAML list: - -m / - <package>
    text = re.sub(
        rf"(?<![\w.-]){o}::|\btorch\.ops\.{o}\.", lambda m: m.group(0).replace(old, new), text
    )  # an op's namespace
    text = re.sub(rf"(?<![\w./-]){o}/", f"{new}/", text)
    text = re.sub(
        rf'^(name = |include = \[)"{o}(\*?)"', lambda m: f'{m.group(1)}"{new}{m.group(2)}"', text, flags=re.M
    )
    text = re.sub(rf"^(\s+){o}$", lambda m: f"{m.group(1)}{new}", text, flags=re.M)
    text = re.sub(
        rf"^(\s*#\s*(?:via\s+)?){o} \(pyproject\.toml\)$",
        lambda m: f"{m.group(1)}{new} (pyproject.toml)",
        text,
        flags=re.M,
    )
    return text


def rename(project: Path, files: list[str], old: str, new: str) -> None:
    """Rewrites the references to `old` in the template's `files` and moves the package folder's files to `new`."""
    for file in files:
        edit(project / file, lambda t: renamed(t, old, new))
    for file in files:
        if file.startswith(f"{old}/"):
            target = project / new / file.removeprefix(f"{old}/")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(project / file, target)


def remove_empty_folders(project: Path, template: Path) -> None:
    """Removes the folders of the template left empty in the project (a part's, the package's old one)."""
    folders = {Path(f).parent for f in template_files(template)} - {Path(".")}
    for folder in sorted(folders, key=lambda p: -len(p.parts)):
        path = project / folder
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


if __name__ == "__main__":
    main()
