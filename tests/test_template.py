"""The template made yours (copier.yml, template/render.py): a project made with `copier copy`, under a package name
of its own and with the parts chosen, holds exactly those parts, installs only their packages (`make install`),
passes its type check and its tests (`make test`), and takes a later release of the template (`copier update`)
over commits of its own, with a conflict only where the user and the template changed the same lines.

The quick tests read copier.yml and exercise template/render.py on small inputs; the slow ones make projects for
real from a git repository of this checkout (tests/template_projects.py)."""

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.conftest import PACKAGE, ROOT
from tests.repo_copy import PARTS, part_files, repository_files
from tests.template_projects import (
    checked,
    commit_all,
    copier,
    copy_command,
    git,
    make,
    make_project,
    pins,
    run,
    template_repository,
    venv_of_pins,
)


def _load_render():
    """template/render.py, copier's task: a script of the template's, not a module of the project."""
    spec = importlib.util.spec_from_file_location("render", ROOT / "template" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render()

COPIER = yaml.safe_load((ROOT / "copier.yml").read_text())
NEW = "myclf"
#: The template's own files: copier leaves them out of every project it makes.
TEMPLATE_ONLY = ["copier.yml", "tests/test_template.py", "tests/template_projects.py"]
#: The packages of optional parts that a project of the core alone must not install.
PART_PACKAGES = [
    "litdata",
    "optuna",
    "litserve",
    "onnxruntime",
    "timm",
    "torchao",
    "boto3",
    "moto",
    "playwright",
]


# -- copier.yml -------------------------------------------------------------------------------------------------


def test_copier_offers_every_part_parts_yaml_lists_all_chosen_by_default():
    question = COPIER["parts"]
    assert question["multiselect"] and list(question["choices"].values()) == list(PARTS)
    assert question["default"] == list(PARTS)
    for label, part in question["choices"].items():
        assert label.startswith(f"{part}: ")


def test_copier_asks_the_name_the_package_and_the_author_with_defaults_that_keep_python_m_project():
    assert COPIER["package_name"]["default"] == PACKAGE
    assert {"project_name", "package_name", "parts", "author_name", "author_email"} <= set(COPIER)


def test_only_the_answers_file_and_the_update_workflow_are_jinja_templates():
    # Every other file (code, configs, CI workflows with their ${{ }} expressions) is copied as it is.
    assert COPIER["_templates_suffix"] == ".jinja"
    templates = [name for name in repository_files() if name.endswith(".jinja")]
    assert templates == [".copier-answers.yml.jinja", ".github/workflows/template-update.yml.jinja"]


def test_parts_yaml_is_plain_yaml_to_copier():
    # copier.yml's _exclude reads it with {% include %}: a Jinja expression in it would be rendered.
    text = (ROOT / "parts.yaml").read_text()
    assert "{{" not in text and "{%" not in text and "{#" not in text


def test_the_task_runs_after_every_render_not_only_the_first_copy():
    # `copier update` renders the template's old and new versions afresh: each must be renamed and trimmed as
    # the project was, or the update's diff would undo the rename. A task gated to `copy` would not run there.
    (task,) = COPIER["_tasks"]
    assert "when" not in task and "_copier_operation" not in json.dumps(COPIER)


# -- template/render.py on small inputs ---------------------------------------------------------------------------

LOCK = """# header
a==1 \\
    --hash=sha256:aa
    # via
    #   project (pyproject.toml)
b==2 ; python_version < '3.11' \\
    --hash=sha256:bb
    # via
    #   a
    #   c
c==3 \\
    --hash=sha256:cc
    # via
    #   project (pyproject.toml)
d==4 \\
    --hash=sha256:dd
    # via
    #   c
pip==25 \\
    --hash=sha256:ee
    # via
    #   -r build/tools.in
"""


def test_the_lock_keeps_what_the_requirements_reach_and_the_tools():
    assert render.trimmed_lock(LOCK, {"a", "c"}) == LOCK
    trimmed = render.trimmed_lock(LOCK, {"a"})
    assert [b.name for b in render.lock_blocks(trimmed)[1]] == ["a", "b", "pip"]
    assert "#   c" not in trimmed and trimmed.startswith("# header\n")
    assert "--hash=sha256:bb" in trimmed  # a kept pin keeps its marker and hashes


def test_the_requirements_are_read_from_the_dependencies_and_the_extras_only(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=69"]\n\n[project]\nname = "x"\ndependencies = [\n'
        '    "torch>=2.4",  # a [comment]\n    "jsonargparse[signatures]>=4",\n]\n\n'
        '[project.optional-dependencies]\ntests = [\n    "moto[s3]>=5.0",\n    "flask",\n]\n'
        'docs = ["sphinx"]  # docs\n\n[tool.setuptools.packages.find]\ninclude = ["x*"]\n'
    )
    assert render.requirement_names(tmp_path / "pyproject.toml") == {
        "torch",
        "jsonargparse",
        "moto",
        "flask",
        "sphinx",
    }


def test_the_rename_rewrites_references_to_the_package_and_nothing_else():
    source = "\n".join(
        [
            f"from {PACKAGE}.cli import main",
            f"import {PACKAGE}",
            f"  class_path: {PACKAGE}.models.SimpleCNN",
            f"python -m {PACKAGE} fit  # {PACKAGE}/cli/config.py",
            f"files: ^{PACKAGE}/",
            f'name = "{PACKAGE}"',
            f'include = ["{PACKAGE}*"]',
            f"   {PACKAGE}",
            f'command = [sys.executable, "-m", "{PACKAGE}", *args]',
            f"  - -m\n  - {PACKAGE}",
            f'custom_op("{PACKAGE}::bias_gelu"), torch.ops.{PACKAGE}.bias_gelu.default',
            f"[{PACKAGE}.optional-dependencies]",
            f'tomllib.loads(text)["{PACKAGE}"]',
            f"the {PACKAGE}'s name, a sub{PACKAGE}.x and py{PACKAGE}.toml",
        ]
    )
    assert render.renamed(source, PACKAGE, NEW).splitlines() == [
        f"from {NEW}.cli import main",
        f"import {NEW}",
        f"  class_path: {NEW}.models.SimpleCNN",
        f"python -m {NEW} fit  # {NEW}/cli/config.py",
        f"files: ^{NEW}/",
        f'name = "{NEW}"',
        f'include = ["{NEW}*"]',
        f"   {NEW}",
        f'command = [sys.executable, "-m", "{NEW}", *args]',
        "  - -m",
        f"  - {NEW}",
        f'custom_op("{NEW}::bias_gelu"), torch.ops.{NEW}.bias_gelu.default',
        f"[{PACKAGE}.optional-dependencies]",
        f'tomllib.loads(text)["{PACKAGE}"]',
        f"the {PACKAGE}'s name, a sub{PACKAGE}.x and py{PACKAGE}.toml",
    ]


def test_a_part_s_marked_lines_go_with_it_in_code_and_in_markdown():
    text = "a\n  # part: x\n  b\n  # /part: x\nc\n<!-- part: y -->\nd\n<!-- /part: y -->\ne\n"
    assert render.without_part_blocks(text, ["x", "y"]) == "a\nc\ne\n"
    assert render.without_part_blocks(text, ["z"]) == text


def test_a_part_kept_stops_listing_the_files_a_part_left_out_took_along():
    parts = (
        "kept:\n  summary: a part\n  commands: []\n  files:\n    - pkg/kept/**\n    - configs/search/kept.yaml\n"
        "    - tests/test_kept_*.py\n"
    )
    files = ["pkg/kept/a/b.py", "tests/test_kept_x.py"]  # the search config went with a part left out
    trimmed = render.without_patterns_of_files_left_out(parts, files)
    assert trimmed == parts.replace("    - configs/search/kept.yaml\n", "")
    assert render.without_patterns_of_files_left_out(trimmed, files) == trimmed


def test_a_table_of_contents_lists_only_the_pages_present(tmp_path):
    (tmp_path / "running.md").write_text("# Running\n")
    page = "# Docs\n\n```{toctree}\n:maxdepth: 2\n\nrunning\nstudies\napi/*\n```\n"
    kept = "# Docs\n\n```{toctree}\n:maxdepth: 2\n\nrunning\napi/*\n```\n"  # a glob stays
    assert render.toctree_of_pages_present(page, tmp_path) == kept


# -- projects made for real ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """This checkout as a template repository at release v1.0.0."""
    return template_repository(tmp_path_factory.mktemp("template") / "template", "v1.0.0")


def expected_files(package: str, parts: list[str]) -> set[str]:
    """The files a project made with `package` and `parts` holds: the template's, less its own and the parts'
    left out, the package's folder under its new name, the answers file rendered."""
    files = set(repository_files()) - set(TEMPLATE_ONLY)
    files = {f for f in files if not f.startswith("template/")}
    for part in set(PARTS) - set(parts):
        files -= set(part_files(part, sorted(files)))
    files = {f.removesuffix(".jinja") for f in files}
    return {f"{package}/{f.removeprefix(f'{PACKAGE}/')}" if f.startswith(f"{PACKAGE}/") else f for f in files}


def project_files(project: Path) -> set[str]:
    return set(git(project, "ls-files").splitlines())


def old_package_references(project: Path) -> list[str]:
    """Lines of the project's text files that still name the template's package as a package."""
    pattern = re.compile(
        rf"\b(import|from) {PACKAGE}\b|(?<![\w\[./-]){PACKAGE}\.[a-z]|-m {PACKAGE}\b|(?<![\w./-]){PACKAGE}/"
    )
    found = []
    for name in project_files(project):
        try:
            text = (project / name).read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{name}: {line.strip()}" for line in text.splitlines() if pattern.search(line)]
    return found


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_the_core_alone_under_another_name_installs_no_part_and_passes_its_type_check_and_tests(
    template, tmp_path
):
    # The documented command (make_project runs it with this template and a folder here).
    assert shlex.split(DOCUMENTED["copy"])[1:-2] == copy_command(Path("T"), Path("D"), NEW, [])[:-2]
    project = make_project(template, tmp_path / "core", NEW, [])
    assert project_files(project) == expected_files(NEW, [])
    assert old_package_references(project) == []
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["package_name"] == NEW and answers["parts"] == [] and answers["_commit"] == "v1.0.0"
    pinned = pins(project / "constraints.txt")
    assert not [p for p in PART_PACKAGES if p in pinned], sorted(pinned)
    extras = tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) == {"plots", "dev", "docs"}

    venv_of_pins(project)
    make(project, "install")  # every pin satisfied: `pip check` finds the core's lock complete
    installed = run([project / ".venv/bin/python", "-m", "pip", "list", "--format=json"], project)
    assert not {canonicalize(d["name"]) for d in json.loads(installed.stdout)} & set(PART_PACKAGES)
    make(project, "typecheck")
    make(project, "test")
    assert git(project, "status", "--porcelain") == ""  # the tests leave nothing behind in the project
    # The update workflow, rendered from its .jinja: GitHub's own ${{ }} expressions intact, a valid workflow.
    workflow = project / ".github" / "workflows" / "template-update.yml"
    assert "${{ github.token }}" in workflow.read_text() and "{%" not in workflow.read_text()
    checked(
        [project / ".venv/bin/check-jsonschema", "--builtin-schema", "vendor.github-workflows", workflow],
        project,
    )


def canonicalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_every_part_under_another_name_passes_its_type_check_and_tests(template, tmp_path):
    project = make_project(template, tmp_path / "full", NEW, list(PARTS))
    assert project_files(project) == expected_files(NEW, list(PARTS))
    assert old_package_references(project) == []
    assert pins(project / "constraints.txt") == pins(ROOT / "constraints.txt")
    venv_of_pins(project)
    make(project, "install")
    make(project, "typecheck")
    make(project, "test")


#: The template fix an update brings: (path in the template, text, its replacement; "" for a line put first).
FIX = [
    # the package's code, which the project holds under its own name: the rename applies to the fix too
    (f"{PACKAGE}/models/mlp.py", "", f"# (Named in configs as {PACKAGE}.models.MLP.)\n"),
    ("configs/cifar10.yaml", "", "# A later release of the template.\n"),  # a config the user left alone
    ("configs/folder.yaml", "max_epochs: 30", "max_epochs: 25"),  # ... and one the user changed there too
    (f"{PACKAGE}/studies/cv.py", "", "# A fix to a part the project left out.\n"),
]
#: The documented commands the update test runs (docs/making-it-yours.md).
DOCUMENTED = {
    "copy": "copier copy --trust --defaults -d package_name=myclf -d 'parts=[]' path/to/template my-classifier",
    "update": "copier update --trust --defaults -d 'parts=[pretrained, dashboards]'",
    "conflicts": "git diff --name-only --diff-filter=U",
}


def template_fix(template: Path, tag: str) -> None:
    """A later release of `template`: FIX applied and a module added, committed and tagged `tag`."""
    for path, old, new in FIX:
        text = (template / path).read_text()
        assert old in text, (path, old)
        (template / path).write_text(text.replace(old, new, 1) if old else new + text)
    (template / PACKAGE / "models" / "constant.py").write_text('"""A module the later release adds."""\n')
    commit_all(template, "A template fix")
    git(template, "tag", tag)


MY_NET = '''"""My own network: one file, a plain nn.Module."""

from torch import nn


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))

    def forward(self, x):
        return self.net(x)
'''


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_an_update_brings_a_template_fix_into_a_renamed_trimmed_project_over_its_own_commits(tmp_path):
    template = template_repository(tmp_path / "template", "v1.0.0")
    project = make_project(template, tmp_path / "mine", NEW, ["pretrained"])
    # The user's own work, committed: a network file, a config edited, the line the template will also change.
    (project / NEW / "models" / "tiny_net.py").write_text(MY_NET)
    sample = project / "configs" / "sample.yaml"
    sample.write_text(sample.read_text().replace("max_epochs: 12", "max_epochs: 3"))
    folder = project / "configs" / "folder.yaml"
    folder.write_text(folder.read_text().replace("max_epochs: 30", "max_epochs: 40"))
    commit_all(project, "My network and my settings")
    template_fix(template, "v1.0.1")

    # The documented update: to the latest release, with the W&B dashboards added to the parts.
    assert all(command in page_text() for command in DOCUMENTED.values())
    copier(*shlex.split(DOCUMENTED["update"])[1:], cwd=project)

    # Only the user's and the template's common line conflicts; the rest merged, nothing rejected.
    unmerged = checked(shlex.split(DOCUMENTED["conflicts"]), project).split()
    assert unmerged == ["configs/folder.yaml"]
    assert not list(project.rglob("*.rej")) and not (project / PACKAGE).exists()
    conflicted = folder.read_text()
    assert (
        "<<<<<<< before updating\n  max_epochs: 40\n=======\n  max_epochs: 25\n>>>>>>> after updating"
        in conflicted
    )
    for name in git(project, "ls-files").splitlines():
        if name != "configs/folder.yaml" and (project / name).is_file():
            text = (project / name).read_text(errors="replace")
            # (the docs page on conflicts shows what a marker looks like, in a code block)
            assert text.count("<<<<<<< ") == page_text().count("<<<<<<< ") * (name == DOCS_PAGE), name
    # The fix reached the renamed package; the user's files are as they were; the part left out stays out.
    assert f"(Named in configs as {NEW}.models.MLP.)" in (project / NEW / "models" / "mlp.py").read_text()
    assert (project / NEW / "models" / "constant.py").is_file()
    assert "# A later release of the template." in (project / "configs" / "cifar10.yaml").read_text()
    assert (project / NEW / "models" / "tiny_net.py").read_text() == MY_NET
    assert "max_epochs: 3\n" in sample.read_text()
    assert not (project / NEW / "studies").exists()
    # The part added: its files, its default callback, and nothing of the parts still left out.
    assert (project / NEW / "callbacks" / "diagnostics" / "wandb_dashboard.py").is_file()
    assert "wandb_dashboard:" in (project / "configs" / "callbacks" / "default.yaml").read_text()
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_commit"] == "v1.0.1" and answers["parts"] == ["pretrained", "dashboards"]

    # Resolved as the docs say (here: the template's value kept), committed; the project works.
    folder.write_text(
        re.sub(
            r"<<<<<<< before updating\n.*?=======\n(.*?)>>>>>>> after updating\n",
            r"\1",
            conflicted,
            flags=re.S,
        )
    )
    git(project, "add", "configs/folder.yaml")
    commit_all(project, "Template update")
    added = {f"{NEW}/models/tiny_net.py", f"{NEW}/models/constant.py"}
    assert project_files(project) == expected_files(NEW, ["pretrained", "dashboards"]) | added
    assert old_package_references(project) == []
    venv_of_pins(project)
    make(project, "install")
    make(project, "test")
    fit = run(
        [project / ".venv/bin/python", "-m", NEW, "fit", "--config", "configs/sample.yaml",
         "--model.net", f"{NEW}.models.tiny_net.TinyNet", "--trainer.max_steps", "2", "--trainer.logger", "false",
         "--test_after_fit", "false", "--trainer.default_root_dir", tmp_path / "runs"],
        project,
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]


DOCS_PAGE = "docs/making-it-yours.md"


def page_text() -> str:
    return (ROOT / DOCS_PAGE).read_text()
