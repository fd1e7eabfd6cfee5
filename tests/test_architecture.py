"""The package's shape: imports run one way with no cycles, and a `fit` imports the core only."""

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, run_python, subprocess_env
from tests.fakes import make_image_folder

PACKAGE = ROOT / "project"

#: From the bottom up: a module may import (at module level) only modules of its own floor or below. Lazy imports
#: inside functions are how a lower floor reaches an optional extra, and are not arrows here.
FLOORS = [
    ["project", "project.errors", "project.models"],
    ["project.atomic_files"],
    ["project.run", "project.data", "project.compression"],
    ["project.distributed"],
    ["project.lit"],
    ["project.callbacks"],
    ["project.cli"],
    ["project.studies", "project.export", "project.__main__"],
    ["project.serve"],
]

#: The optional extras: a `fit` that names none of them imports nothing of them.
EXTRAS = (
    "project.compression",
    "project.studies",
    "project.export",
    "project.serve",
    "project.callbacks.tuning",
    "project.callbacks.debug",
    "project.callbacks.lookahead",
    "project.callbacks.whitening",
    "project.callbacks.diagnostics.throughput",
    "project.callbacks.diagnostics.update_ratio",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports() -> dict[str, set[str]]:
    """Each module of the package -> the project modules it imports at module level (not inside functions)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.parse(path.read_text()).body:  # module level only
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def floor(module: str) -> int:
    matches = [
        (len(prefix), i)
        for i, names in enumerate(FLOORS)
        for prefix in names
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is on no floor of tests/test_architecture.py FLOORS"
    return max(matches)[1]


def test_imports_never_run_upward():
    upward = [
        f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
        for a, targets in module_level_imports().items()
        for b in targets
        if floor(b) > floor(a)
    ]
    assert not upward, upward


def test_the_import_graph_has_no_cycle():
    graph = module_level_imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            # A package's __init__ importing its own submodules is not a cycle of concern: only cross-package.
            assert cycle is None or all(cycle[0].split(".")[1] == m.split(".")[1] for m in cycle), cycle


FIT_IMPORTS = """
import sys
from project.cli import main
main(sys.argv[1:])
print("IMPORTED " + " ".join(sorted(m for m in sys.modules if m == "project" or m.startswith("project."))))
"""


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
    [
        "project",
        "project.callbacks",
        "project.callbacks.budget_end_validation",
        "project.callbacks.checkpoint",
        "project.callbacks.diagnostics",
        "project.callbacks.diagnostics.data_wait",
        "project.callbacks.diagnostics.grad_norm",
        "project.callbacks.diagnostics.nonfinite",
        "project.callbacks.diagnostics.wandb_dashboard",
        "project.callbacks.effective_batch_size",
        "project.callbacks.prediction_writer",
        "project.cli",
        "project.cli.config",
        "project.cli.lightning_notices",
        "project.cli.trainer_callbacks",
        "project.data",
        "project.data.augment",
        "project.data.cifar",
        "project.data.csv_files",
        "project.data.csv_images",
        "project.data.datamodule",
        "project.data.folder",
        "project.data.image_files",
        "project.data.samplers",
        "project.data.folds",
        "project.data.image_cache",
        "project.data.images",
        "project.data.tensor_dataset",
        "project.distributed",
        "project.distributed.fsdp2",
        "project.distributed.sharding",
        "project.errors",
        "project.atomic_files",
        "project.lit",
        "project.lit.factories",
        "project.lit.image_classifier",
        "project.lit.multilabel_classifier",
        "project.lit.task",
        "project.lit.tta",
        "project.models",
        "project.models.airbench",
        "project.models.cifar_resnet",
        "project.models.init",
        "project.models.mlp",
        "project.models.simple_cnn",
        "project.models.timm_net",
        "project.models.torchvision_net",
        "project.run",
        "project.run.checkpoints",
        "project.run.interrupts",
        "project.run.lightning_private",
        "project.run.plan",
        "project.run.preemption",
        "project.run.provenance",
        "project.run.redaction",
        "project.run.resume",
        "project.run.run_folder",
        "project.run.startup",
        "project.run.wandb_logger",
    ]
)


NAMES_PRUNING = """
import sys
from project.cli.config import parse_fit_args
_, config = parse_fit_args(["--config", "configs/cifar10.yaml", "--config", "configs/callbacks/pruning.yaml"])
print([str(c.class_path) for c in config.trainer.callbacks])
"""


def test_a_config_that_names_an_optional_callback_imports_it():
    proc = subprocess.run(
        [sys.executable, "-c", NAMES_PRUNING], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0 and "project.compression.pruning.ProgressivePruning" in proc.stdout, (
        proc.stderr
    )
