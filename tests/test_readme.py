"""Every command on every page (the README and docs/*.md) is run by a test: the `python -m project ...` lines
parse here (the end-to-end tests run their equivalents), the `make` lines dry-run here, and each other kind of
command has the test that runs it named in `RUNNERS`; a shell line that no kind claims fails
`test_every_shell_command_on_every_page_is_run_by_a_test`."""

import importlib
import os
import re
import shlex
import subprocess

import pytest
import yaml

from project.cli import TOOLS, run_command
from tests import docs_pages
from tests import test_making_it_yours as making_it_yours
from tests.conftest import PACKAGE, ROOT

COMMANDS = docs_pages.cli_commands()
CLI = f"python -m {PACKAGE} "


def is_make(line: str) -> bool:
    words = shlex.split(line)
    return "make" in words and all("=" in w for w in words[: words.index("make")])


#: Each kind of shell command a page may hold: what it looks like, and the test that runs it (module, name).
RUNNERS = {
    "python -m project": (lambda c: c.startswith(CLI), ("tests.test_readme", "test_readme_command_parses")),
    "make": (is_make, ("tests.test_readme", "test_documented_make_commands_dry_run")),
    "torchrun": (
        lambda c: c.startswith("torchrun ") and f" -m {PACKAGE} " in c,
        ("tests.test_distributed", "test_readme_torchrun_commands_parse"),
    ),
    "copier copy or update (making a project of your own)": (
        lambda c: c in making_it_yours.page_commands("copier"),
        ("tests.test_making_it_yours", "test_the_copier_commands_name_copiers_subcommands_and_options"),
    ),
    "git, around copier (making a project of your own)": (
        lambda c: c in making_it_yours.page_commands("git"),
        ("tests.test_making_it_yours", "test_the_git_commands_run_in_order_in_a_repository"),
    ),
    # An optional part's kinds of command go with it (parts.yaml), as its pages and tests do.
    # part: cluster
    "sbatch the training script": (
        lambda c: (
            (c.startswith("sbatch ") and "train.sbatch" in c) or (c.startswith("CONFIG=") and " sbatch " in c)
        ),
        ("tests.test_slurm_script", "test_readme_sbatch_commands_pass_their_arguments"),
    ),
    # /part: cluster
    # part: studies
    "cv or tune inside sbatch or a shell loop": (
        lambda c: not c.startswith(CLI) and re.search(f"{CLI}(cv|tune) ", c) is not None,
        ("tests.test_tune", "test_the_readme_lines_that_start_studies_on_slurm_or_many_gpus_parse"),
    ),
    "a W&B sweep": (
        lambda c: c.startswith(("wandb sweep ", "wandb agent ")),
        ("tests.test_tune", "test_sweep_config_resolves_to_a_valid_fit_command"),
    ),
    # /part: studies
    # part: production
    "an upload to serve": (
        lambda c: c.startswith("curl ") and "/predict" in c,
        ("tests.test_serve", "test_serve_classifies_rejects_and_stops"),
    ),
    "the C++ example's build and run": (
        lambda c: c.startswith("cmake ") or " build/aoti_cpp/classify " in f" {c}",
        ("tests.test_aoti_cpp", "test_the_cpp_example_classifies_image_files_as_python_does"),
    ),
    # /part: production
}


def test_readme_has_commands():
    assert len(COMMANDS) >= 10
    assert len({page for page, _ in docs_pages.shell_lines()}) >= 8  # the README and the docs pages


def test_every_shell_command_on_every_page_is_run_by_a_test():
    unclaimed = [
        (page, line)
        for page, line in docs_pages.shell_lines()
        if not any(claims(line) for claims, _ in RUNNERS.values())
    ]
    assert not unclaimed, f"no test runs these documented commands: add one to RUNNERS: {unclaimed}"
    for _, (module, name) in RUNNERS.values():
        assert callable(getattr(importlib.import_module(module), name, None)), (module, name)


def test_the_coverage_check_fails_on_a_command_no_test_runs():
    assert not any(claims("rm -rf logs/") for claims, _ in RUNNERS.values())
    assert not any(claims("python -m benchmarks.serve_load") for claims, _ in RUNNERS.values())


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


def make_commands() -> list[str]:
    return sorted({line for _, line in docs_pages.shell_lines() if is_make(line)})


@pytest.mark.parametrize("command", make_commands())
def test_documented_make_commands_dry_run(command, tmp_path):
    """Each documented `make ...` line, as make would run it (-n -B: every command printed, none executed), into
    a venv of its own; the first run and the CPU-only route do what the pages say."""
    words = shlex.split(command)
    env = dict(w.split("=", 1) for w in words[: words.index("make")])
    args = words[words.index("make") + 1 :]
    dry = ["make", "-n", "-B", "-f", str(ROOT / "Makefile"), f"VENV={tmp_path / 'venv'}", *args]
    run = subprocess.run(dry, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip(), run.stdout + run.stderr
    target = next(a for a in args if "=" not in a)
    assert re.search(rf"^{re.escape(target)}:.*## ", (ROOT / "Makefile").read_text(), re.M)  # in `make help`
    if args == ["train"]:  # the README's first command
        assert f"-m {PACKAGE} fit --config configs/sample.yaml" in run.stdout
    if target == "train" and any(a.startswith("ROOT=") for a in args):
        root = next(a for a in args if a.startswith("ROOT=")).split("=", 1)[1]
        assert f"fit --config configs/folder.yaml --data.root {root}" in run.stdout
    if "CONSTRAINTS=" in args:  # the version ranges, unhashed: where another index (CPU-only torch) may serve
        assert "--require-hashes" not in run.stdout and "pip install -q -e '.[" in run.stdout


def test_no_page_names_a_run_folder_whose_number_varies():
    # Every command makes its own runs/version_N: a page that says version_0 is right only for the first.
    assert not [
        (page.name, n)
        for page in docs_pages.PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if "version_0" in line
    ]


def _layout_section() -> str:
    return docs_pages.section(docs_pages.DOCS / "extending.md", "Layout")


def _start_here_files() -> list:
    """The files of the "Start here" block of docs/extending.md (`dir/a.py, b.py` names two files in dir/)."""
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
    assert top <= {
        "__init__.py",
        "__main__.py",
        "errors.py",
        "atomic_files.py",
        "redaction.py",
        "lightning_private.py",
        "machine.py",
        "registry.py",
    }, top


#: The most lines a module of the package may have: what a reader takes in at one sitting. The command-line
#: layer, read first by everyone who follows a command, keeps to fewer.
MAX_MODULE_LINES, MAX_CLI_MODULE_LINES = 400, 300


def test_no_module_is_longer_than_a_sitting():
    lengths = {p: len(p.read_text().splitlines()) for p in (ROOT / PACKAGE).rglob("*.py")}
    long = {str(p): n for p, n in lengths.items() if n > MAX_MODULE_LINES}
    long |= {str(p): n for p, n in lengths.items() if n > MAX_CLI_MODULE_LINES and p.parent.name == "cli"}
    assert not long, long
