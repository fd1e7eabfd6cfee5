"""Projects made from this template with copier, as a user makes them, for tests/test_template.py.

The template is a git repository of this checkout's files (what git would commit: the tracked files and the new
ones not ignored), tagged as a release: copier copies a template's latest tag, and `copier update` moves a
project from the tag it was made at to a later one. A project made from it gets a virtual environment of the
pins its own lock holds, linked from the environment running the tests (nothing is downloaded): its
`make install` then finds each of them installed, and anything its lock lacks is missing there as it would be.
"""

import json
import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.repo_copy import copy_repository

#: An identity for the commits a test makes, copier's output without colours, and nothing of this environment
#: leaking in: not its package (PYTHONPATH), nor its scripts ahead of the project's own.
ENVIRONMENT = {
    **{
        k: v
        for k, v in os.environ.items()
        if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VIRTUAL_ENV", "PYTHONPATH")
    },
    "PATH": os.pathsep.join(
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if Path(p).resolve() != Path(sys.executable).parent.resolve()
    ),
    "GIT_AUTHOR_NAME": "Template Tests",
    "GIT_AUTHOR_EMAIL": "tests@example.com",
    "GIT_COMMITTER_NAME": "Template Tests",
    "GIT_COMMITTER_EMAIL": "tests@example.com",
    "NO_COLOR": "1",
}


def run(command: list[str | Path], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """`command` in `cwd`; its output kept, its exit status left for the test to check."""
    return subprocess.run(
        [str(c) for c in command], cwd=cwd, env=ENVIRONMENT, capture_output=True, text=True, timeout=timeout
    )


def checked(command: list[str | Path], cwd: Path, timeout: int = 900) -> str:
    """`command`'s output, after checking that it succeeded."""
    done = run(command, cwd, timeout)
    # A test run's failures first (its end is a summary of warnings and names), then the output's end.
    failures = done.stdout.partition("= FAILURES =")[2][:12000]
    assert done.returncode == 0, (
        f"{' '.join(map(str, command))}:\n{failures}\n...\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done.stdout


def git(folder: Path, *args: str) -> str:
    return checked(["git", *args], folder)


def template_repository(folder: Path, tag: str) -> Path:
    """This checkout's files as a git repository in `folder`, its one commit tagged `tag`."""
    copy_repository(folder)
    git(folder, "init", "-q", "-b", "main")
    commit_all(folder, "The template")
    git(folder, "tag", tag)
    return folder


def commit_all(folder: Path, message: str) -> None:
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", message)


def copier(*args: str | Path, cwd: Path) -> str:
    """The `copier` command (this environment's), as the docs run it."""
    return checked([sys.executable, "-m", "copier", *args], cwd)


def copy_command(template: Path, destination: Path, package: str, parts: list[str]) -> list[str | Path]:
    """`copier copy` with the answers given on the command line and the defaults for the rest."""
    answers = ["-d", f"package_name={package}", "-d", f"parts={json.dumps(parts)}"]
    return ["copy", "--trust", "--defaults", *answers, template, destination]


def make_project(template: Path, destination: Path, package: str, parts: list[str]) -> Path:
    """A project made from `template` with `package` and `parts`, committed as its first commit (copier's
    `update` needs a clean git repository)."""
    copier(*copy_command(template, destination, package, parts), cwd=destination.parent)
    git(destination, "init", "-q", "-b", "main")
    commit_all(destination, "A new project from the template")
    return destination


def pins(lock: Path) -> dict[str, str]:
    """name -> version of the lock's pins that apply to this interpreter and platform."""
    found = {}
    for line in lock.read_text().replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            requirement = Requirement(line.split(" --hash=")[0].strip())
            if requirement.marker is None or requirement.marker.evaluate(default_environment()):
                (specifier,) = requirement.specifier
                found[canonicalize_name(requirement.name)] = specifier.version
    return found


def venv_of_pins(project: Path) -> Path:
    """`project/.venv`: a virtual environment whose site-packages link to this environment's files of the
    distributions `project/constraints.txt` pins, and only those, with their scripts. Refused, before anything
    is made, unless each pin is the version installed here: pip then finds every pin satisfied and changes no
    linked file."""
    wanted = pins(project / "constraints.txt")
    site = Path(sysconfig.get_paths()["purelib"])
    here = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site)])}
    differ = {
        n: (v, here[n].version if n in here else None)
        for n, v in wanted.items()
        if n not in here or here[n].version != v
    }
    assert not differ, f"pinned (version, installed here) that differ: {differ}"
    venv = project / ".venv"
    base = getattr(sys, "_base_executable", sys.executable)
    checked([base, "-m", "venv", "--without-pip", venv], project)
    target = Path(
        checked(
            [venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], project
        ).strip()
    )

    owners: dict[
        tuple[str, ...], set[str]
    ] = {}  # a path under site-packages -> the distributions with files there
    children: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    scripts: list[tuple[str, Path]] = []
    for name, dist in here.items():
        for file in dist.files or []:
            if file.parts[0] == "..":
                scripts += [(name, Path(str(dist.locate_file(file))).resolve())] if name in wanted else []
                continue
            for depth in range(1, len(file.parts) + 1):
                owners.setdefault(file.parts[:depth], set()).add(name)
                children.setdefault(file.parts[: depth - 1], set()).add(file.parts[:depth])

    def link(parts: tuple[str, ...]) -> None:
        """Links `parts` whole where all it holds is pinned; else a folder of its pinned entries."""
        source, copy = site.joinpath(*parts), target.joinpath(*parts)
        if parts[-1] == "__pycache__" or not owners[parts] & wanted.keys() or not source.exists():
            return
        if owners[parts] <= wanted.keys() or not source.is_dir():
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.symlink_to(source)
            return
        copy.mkdir(parents=True, exist_ok=True)
        for child in children.get(parts, ()):
            link(child)

    for top in children[()]:
        link(top)
    # The scripts: a console script anew for this environment's interpreter, any other (a binary) linked.
    entry_points = {
        ep.name: ep for name in wanted for ep in here[name].entry_points if ep.group == "console_scripts"
    }
    scripts_folder = Path(sysconfig.get_paths()["scripts"]).resolve()
    for _, script in scripts:
        made = venv / "bin" / script.name
        if script.parent != scripts_folder or made.exists():
            continue
        if script.name in entry_points:
            module, _, attribute = entry_points[script.name].value.partition(":")
            made.write_text(
                f"#!{venv / 'bin/python'}\nimport sys\nfrom {module} import {attribute.split('.')[0]}\n"
                f"sys.exit({attribute}())\n"
            )
            made.chmod(0o755)
        else:
            made.symlink_to(script)
    return venv


def make(project: Path, *targets: str, timeout: int = 1500) -> str:
    """`make <targets>` in `project`, its output after checking that it succeeded."""
    return checked(["make", *targets], project, timeout)
