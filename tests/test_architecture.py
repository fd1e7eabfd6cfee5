"""The package's shape: imports run one way with no cycles, and a `fit` imports the core only."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PACKAGE, ROOT, run_python, subprocess_env
from tests.fakes import make_image_folder

PACKAGE_DIR = ROOT / PACKAGE


def modules(*names: str) -> list[str]:
    """The package's modules `names` (relative, e.g. `cli.config`; "" is the package itself) by their full names."""
    return [f"{PACKAGE}.{name}" if name else PACKAGE for name in names]


#: From the bottom up: a module may import only modules of its own floor or below, at module level or inside a
#: function (a lazy import is an arrow all the same: it runs when the function does). An optional extra is reached
#: from below by name alone (`importlib.import_module` of a string a config or a registry holds). A tool command
#: reads a fit config with the CLI's parser, so its package sits above the CLI: `streaming` holds `prepare` and the
#: source it writes for, and nothing below imports it.
FLOORS = [
    modules("", "errors", "models", "machine"),
    modules("atomic_files", "lightning_private", "redaction"),
    modules("run", "data", "csv", "compression", "loggers"),
    modules("distributed"),
    modules("tasks", "tags", "regression"),
    modules("callbacks"),
    modules("cli"),
    modules("studies", "export", "__main__", "streaming"),
    modules("serve"),
]

#: The optional extras: a `fit` that names none of them imports nothing of them.
EXTRAS = tuple(
    modules(
        "compression",
        "studies",
        "export",
        "serve",
        "callbacks.tuning",
        "callbacks.debug",
        "callbacks.lookahead",
        "callbacks.whitening",
        "callbacks.diagnostics.throughput",
        "callbacks.diagnostics.update_ratio",
    )
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, name: str, is_package: bool, lazy: bool) -> set[str]:
    """The dotted names the module `name` (its `source`) imports: at module level, or with `lazy` anywhere, inside
    functions too. `from a import b` imports `a` and, where it is a module, `a.b`; relative imports are resolved."""
    package = name if is_package else name.rpartition(".")[0]
    nodes = ast.walk(ast.parse(source)) if lazy else iter(ast.parse(source).body)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {module} | {f"{module}.{a.name}" for a in node.names}
    return found


def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (see `imported`)."""
    paths = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    return {
        name: {
            m
            for m in imported(p.read_text(), name, p.name == "__init__.py", lazy)
            if m in paths and m != name
        }
        for name, p in paths.items()
    }


def floor(module: str) -> int:
    matches = [
        (len(prefix), i)
        for i, names in enumerate(FLOORS)
        for prefix in names
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is on no floor of tests/test_architecture.py FLOORS"
    return max(matches)[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if floor(b) > floor(a)
    ]


def test_imports_never_run_upward():
    assert upward_imports(import_graph(lazy=True)) == []


def test_the_rule_sees_an_import_inside_a_function():
    source = f"def run():\n    from {PACKAGE}.cli.config import parse_fit_args\n    from . import folds\n"
    found = imported(source, f"{PACKAGE}.data.x", False, lazy=True)
    assert {f"{PACKAGE}.cli.config", f"{PACKAGE}.data.folds"} <= found
    assert imported(source, f"{PACKAGE}.data.x", False, lazy=False) == set()
    graph = {f"{PACKAGE}.data.x": {f"{PACKAGE}.cli.config", f"{PACKAGE}.data.folds"}}
    assert upward_imports(graph) == [f"{PACKAGE}.data.x (floor 2) imports {PACKAGE}.cli.config (floor 6)"]


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle():
    # A package's modules importing one another through its __init__ is Python's own business; what matters is
    # that no cycle runs through two packages.
    across = [c for c in strongly_connected(import_graph()) if len({m.split(".")[1] for m in c}) > 1]
    assert across == []


def test_the_cycle_check_sees_a_cycle_across_packages():
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": {"p.b"}, "p.b": {"p.a.x"}, "p.c": {"p.c.z"}, "p.c.z": {"p.c"}}
    assert sorted(map(sorted, strongly_connected(graph))) == [["p.a.x", "p.b", "p.b.y"], ["p.c", "p.c.z"]]


def mixins(cls: type) -> list[str]:
    """The package's classes among `cls`'s ancestors that are not DataModules themselves: mixed-in behaviour."""
    import lightning as L

    return [
        base.__name__
        for base in cls.__mro__[1:]
        if base.__module__.partition(".")[0] == PACKAGE and not issubclass(base, L.LightningDataModule)
    ]


def test_data_modules_are_composed_not_mixed_in():
    """A DataModule holds what it is made of (its folds, its augmentation, its datasets) rather than inheriting it
    from mixins: each of the package's is one chain of DataModules."""
    import importlib
    import inspect
    import pkgutil

    import lightning as L

    data = importlib.import_module(f"{PACKAGE}.data")
    found = {}
    for info in pkgutil.iter_modules(data.__path__, f"{PACKAGE}.data."):
        for _, cls in inspect.getmembers(importlib.import_module(info.name), inspect.isclass):
            if issubclass(cls, L.LightningDataModule) and cls.__module__ == info.name:
                found[cls.__name__] = mixins(cls)
    assert len(found) >= 3, found  # the image base, the files base and a source at least
    assert {name: bases for name, bases in found.items() if bases} == {}


def test_the_rule_sees_a_mixin():
    import lightning as L

    mixin = type("FoldsMixin", (), {"__module__": f"{PACKAGE}.data.x"})
    mixed = type("MixedDataModule", (mixin, L.LightningDataModule), {"__module__": f"{PACKAGE}.data.x"})
    assert mixins(mixed) == ["FoldsMixin"]


def own_behaviour(cls: type) -> list[str]:
    """What a class defines beyond its constructor and documentation: its own methods and attributes."""
    plain = {"__init__", "__doc__", "__module__", "__qualname__", "__firstlineno__", "__static_attributes__"}
    plain |= {"__slotnames__"}  # what pickling an instance caches on its class
    return sorted(set(vars(cls)) - plain - {"__annotations__", "__dict__", "__weakref__"})


def test_data_modules_of_image_files_hold_their_source():
    """Where labelled image files come from is an object the DataModule of image files holds (a `FileSource`):
    the registered DataModules of image files only build theirs from their settings, and add nothing."""
    import importlib

    from project.registry import load_all

    data = importlib.import_module(f"{PACKAGE}.data")
    facades = [c for c in load_all("datamodules").values() if issubclass(c, data.ImageFilesDataModule)]
    facades = [c for c in facades if c is not data.ImageFilesDataModule]
    assert data.ImageFolderDataModule in facades  # (and those the parts present register)
    assert all(cls.__bases__ == (data.ImageFilesDataModule,) for cls in facades)
    assert {cls.__name__: own_behaviour(cls) for cls in facades if own_behaviour(cls)} == {}


def test_the_rule_sees_behaviour_added_to_a_data_module():
    subclass = type("Folders", (), {"__init__": lambda self: None, "scan": lambda self, split: None})
    assert own_behaviour(subclass) == ["scan"]


FIT_IMPORTS = f"""
import sys
from {PACKAGE}.cli import main
main(sys.argv[1:])
print("IMPORTED " + " ".join(sorted(m for m in sys.modules if m.partition(".")[0] == {PACKAGE!r})))
"""


@pytest.mark.slow
def test_a_fit_imports_the_core_and_no_optional_extra(tmp_path):
    images = make_image_folder(tmp_path / "images", extras=False)
    args = ["fit", "--config", "configs/folder.yaml", "--data.root", images, "--data.image_size", "16"]
    args += ["--data.cache_dir", tmp_path / "cache", "--model.net", "SimpleCNN", "--trainer.max_steps", "1"]
    args += ["--trainer.default_root_dir", tmp_path / "logs", "--trainer.enable_progress_bar", "false"]
    proc = run_python("-c", FIT_IMPORTS, *args)
    imported = set(proc.stdout.split("IMPORTED ")[-1].split())
    assert not [m for m in imported if m.startswith(EXTRAS)], sorted(imported)
    # Pinned: a module joining what every fit imports is a decision (README "Layout" says what a fit reads).
    assert imported == FIT_CORE, f"new: {sorted(imported - FIT_CORE)}, gone: {sorted(FIT_CORE - imported)}"


FIT_CORE = set(
    modules(
        "",
        "callbacks",
        "callbacks.budget_end_validation",
        "callbacks.checkpoint",
        "callbacks.diagnostics",
        "callbacks.diagnostics.data_wait",
        "callbacks.diagnostics.grad_norm",
        "callbacks.diagnostics.nonfinite",
        # part: dashboards
        "callbacks.diagnostics.wandb_dashboard",
        "callbacks.diagnostics.wandb_charts",
        # /part: dashboards
        "callbacks.effective_batch_size",
        "callbacks.interrupts",
        "callbacks.logs_before_checkpoints",
        "callbacks.network_summary",
        "callbacks.preemption",
        "callbacks.rng_state",
        "callbacks.run_info",
        "callbacks.save_config",
        "callbacks.prediction_writer",
        "cli",
        "cli.commands",
        "cli.config",
        "cli.config_checks",
        "cli.lightning_notices",
        "cli.tool_args",
        "cli.trainer_callbacks",
        "data",
        "data.augment",
        "data.datamodule",
        "data.class_folders",
        "data.file_source",
        "data.labelled_files",
        "data.samplers",
        "data.splits",
        "data.decoded_cache",
        "data.label_checks",
        "data.image_reading",
        "data.tensor_dataset",
        "data.targets",
        "distributed",
        "distributed.fsdp2",
        "distributed.sharding",
        "errors",
        "atomic_files",
        "tasks",
        "tasks.data_agreement",
        "tasks.factories",
        "tasks.image_classifier",
        "tasks.task",
        "tasks.tta",
        "models",
        "models.airbench",
        "models.cifar_resnet",
        "models.downloads",
        "models.init",
        "models.mlp",
        "models.simple_cnn",
        "models.torchvision_net",
        "run",
        "run.checkpoints",
        "run.plan",
        "redaction",
        "registry",
        "run.resume",
        "run.run_folder",
        "run.startup",
        "lightning_private",
        "machine",
        "loggers",
        "loggers.wandb",
    )
)


NAMES_AN_OPTIONAL_CALLBACK = f"""
import sys
from {PACKAGE}.cli.config import parse_fit_args
_, config = parse_fit_args(["--config", "configs/cifar10.yaml", "--config", "configs/callbacks/diagnostics.yaml"])
print([str(c.class_path) for c in config.trainer.callbacks])
"""


def test_a_config_that_names_an_optional_callback_imports_it():
    proc = subprocess.run(
        [sys.executable, "-c", NAMES_AN_OPTIONAL_CALLBACK],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"{PACKAGE}.callbacks.UpdateRatioMonitor" in proc.stdout, proc.stdout  # found by its short name
