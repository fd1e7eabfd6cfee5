"""The copier and git commands of docs/making-it-yours.md are real ones: each copier line names a subcommand and
options that copier has, and the git lines run, in order, in a repository. The template's own tests
(tests/test_template.py, left out of a project made from it) run them for real: `copier copy`, then
`copier update` with a template fix, a part added and a conflict, and the git and make lines between."""

import os
import re
import shlex
import subprocess
import sys

from tests import docs_pages

PAGE = "docs/making-it-yours.md"


def page_commands(program: str) -> list[str]:
    return [
        line for page, line in docs_pages.shell_lines() if page == PAGE and line.startswith(f"{program} ")
    ]


def help_of(*command: str) -> str:
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def options(words: list[str]) -> list[str]:
    """The long and short options of a command line (`-d` and its value count as `-d`)."""
    return [w.split("=", 1)[0] for w in words if w.startswith("-") and not w.startswith("--=")]


def test_the_copier_commands_name_copiers_subcommands_and_options():
    commands = page_commands("copier")
    assert {shlex.split(c)[1] for c in commands} == {"copy", "update"}
    for command in commands:
        words = shlex.split(command)
        known = help_of(sys.executable, "-m", "copier", words[1])
        for option in options(words[2:]):
            assert re.search(rf"(^|[\s,]){re.escape(option)}\b", known), (command, option)


def test_the_git_commands_run_in_order_in_a_repository(tmp_path):
    """Each git line of the page, in order, in a scratch repository holding the file the page names (changed
    before each commit, as an update would have changed it)."""
    environment = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    commands = page_commands("git")
    assert commands[0] == "git init" and sum(c.startswith("git commit ") for c in commands) >= 2
    for n, command in enumerate(commands):
        (tmp_path / "configs").mkdir(exist_ok=True)
        (tmp_path / "configs" / "folder.yaml").write_text(f"trainer:\n  max_epochs: {n}\n")
        done = subprocess.run(
            shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=60,
            env={**os.environ, **environment},
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stdout, done.stderr)
