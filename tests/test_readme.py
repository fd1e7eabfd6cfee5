"""Every `python -m project ...` command in the README parses (the end-to-end tests run their equivalents)."""

import re
import shlex

import pytest
import yaml

from project.cli import TOOLS, run_command
from tests.conftest import PACKAGE, ROOT

COMMANDS = [
    line.split("  #")[0].strip()
    for line in (ROOT / "README.md").read_text().splitlines()
    if line.strip().startswith("python -m project ")
]


def test_readme_has_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command, image_folder, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = shlex.split(command.replace("path/to/images", str(image_folder)))[3:]
    # Tool commands are run by their own tests (tests/test_export.py, test_serve.py, ...); here they parse.
    if args[0] in TOOLS:
        module = __import__(TOOLS[args[0]][0].split(":")[0], fromlist=["parse_args"])
        kwargs = module.parse_args(args[1:])  # every flag known and well typed; nothing is run
        given = dict(zip(args[1::2], args[2::2], strict=False))
        # cv and tune pass every flag that is not their own to each `fit`, in order, as `fit_args`.
        forwarded = dict(zip(kwargs.get("fit_args", [])[::2], kwargs.get("fit_args", [])[1::2], strict=False))
        assert {
            k: forwarded[k] if k in forwarded else str(kwargs[k[2:]]) for k in given if k != "--config"
        } == {k: v for k, v in given.items() if k != "--config"}
        return
    args = [a for a in args if a != "--print_config"] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        run_command(args)
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    assert "model" in yaml.safe_load(capsys.readouterr().out)


def _layout_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## Layout") : text.index("\n## ", text.index("## Layout") + 1)]


def _start_here_files() -> list:
    """The files of the README's "Start here" block (`dir/a.py, b.py` names two files in dir/)."""
    block = _layout_section().split("```")[1]
    files = []
    for line in block.splitlines():
        names = line.split("  ")[0].strip()
        if not names:
            continue
        first, *rest = [n.strip() for n in names.split(",")]
        files.append(ROOT / first)
        files += [(ROOT / first).parent / name for name in rest]
    return files


def test_start_here_is_short_and_says_how_long_it_is():
    files = _start_here_files()
    assert files and all(f.is_file() for f in files), [f for f in files if not f.is_file()]
    lines = sum(len(f.read_text().splitlines()) for f in files)
    stated = int(re.search(r"about ([\d,]+) lines", _layout_section()).group(1).replace(",", ""))
    assert lines <= 1500 and abs(lines - stated) <= 0.1 * stated, (lines, stated)


def test_layout_names_every_folder_and_the_top_of_project_stays_small():
    layout = _layout_section()
    folders = [p for p in (ROOT / PACKAGE).rglob("*") if p.is_dir() and p.name != "__pycache__"]
    for folder in folders:
        relative = folder.relative_to(ROOT / PACKAGE)
        assert f"{relative.parts[0]}/" in layout and (
            len(relative.parts) == 1 or f"{folder.name}/" in layout
        ), folder
    top = {p.name for p in (ROOT / PACKAGE).iterdir() if p.is_file() and p.suffix == ".py"}
    assert top <= {"__init__.py", "__main__.py", "errors.py", "atomic_files.py"}, top


def test_no_module_is_longer_than_300_lines():
    long = {str(p): n for p in (ROOT / PACKAGE).rglob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long, long


def test_the_documented_postgresql_url_has_its_driver_installed():
    """The README's `--storage postgresql://...` works as written with the `postgres` extra: SQLAlchemy maps the
    bare URL to psycopg 3, which the extra installs (psycopg2 would not be found)."""
    import sqlalchemy

    text = (ROOT / "README.md").read_text()
    urls = re.findall(r"--storage (postgresql[^\s']*)", text)
    assert urls
    for url in urls:
        dialect = sqlalchemy.engine.make_url(url).get_dialect()
        assert dialect.driver == "psycopg", (url, dialect.driver)
        dialect.import_dbapi()  # the driver itself is installed
