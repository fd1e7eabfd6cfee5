"""The package's shape: imports run one way with no cycles, and a `fit` imports the core only."""

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import PACKAGE, ROOT, run_python, subprocess_env
from tests.fakes import make_image_folder

PACKAGE_DIR = ROOT / PACKAGE


def modules(*names: str) -> list[str]:
    """The package's modules `names` (relative, e.g. `cli.config`; "" is the package itself) by their full names."""
    return [f"{PACKAGE}.{name}" if name else PACKAGE for name in names]


#: From the bottom up: a module may import (at module level) only modules of its own floor or below. Lazy imports
#: inside functions are how a lower floor reaches an optional extra, and are not arrows here.
FLOORS = [
    modules("", "errors", "models"),
    modules("atomic_files"),
    modules("run", "data", "compression"),
    modules("distributed"),
    modules("tasks"),
    modules("callbacks"),
    modules("cli"),
    modules("studies", "export", "__main__"),
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


def module_level_imports() -> dict[str, set[str]]:
    """Each module of the package -> the project modules it imports at module level (not inside functions)."""
    modules = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
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


FIT_IMPORTS = f"""
import sys
from {PACKAGE}.cli import main
main(sys.argv[1:])
print("IMPORTED " + " ".join(sorted(m for m in sys.modules if m.partition(".")[0] == {PACKAGE!r})))
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
    modules(
        "",
        "callbacks",
        "callbacks.budget_end_validation",
        "callbacks.checkpoint",
        "callbacks.diagnostics",
        "callbacks.diagnostics.data_wait",
        "callbacks.diagnostics.grad_norm",
        "callbacks.diagnostics.nonfinite",
        "callbacks.diagnostics.wandb_dashboard",
        "callbacks.effective_batch_size",
        "callbacks.prediction_writer",
        "cli",
        "cli.config",
        "cli.lightning_notices",
        "cli.trainer_callbacks",
        "data",
        "data.augment",
        "data.cifar",
        "data.csv_files",
        "data.csv_images",
        "data.datamodule",
        "data.folder",
        "data.image_files",
        "data.samplers",
        "data.folds",
        "data.image_cache",
        "data.label_checks",
        "data.images",
        "data.tensor_dataset",
        "distributed",
        "distributed.fsdp2",
        "distributed.sharding",
        "errors",
        "atomic_files",
        "tasks",
        "tasks.factories",
        "tasks.image_classifier",
        "tasks.multilabel_classifier",
        "tasks.task",
        "tasks.tta",
        "models",
        "models.airbench",
        "models.cifar_resnet",
        "models.init",
        "models.mlp",
        "models.simple_cnn",
        "models.timm_net",
        "models.torchvision_net",
        "run",
        "run.checkpoints",
        "run.interrupts",
        "run.lightning_private",
        "run.plan",
        "run.preemption",
        "run.provenance",
        "run.redaction",
        "run.resume",
        "run.run_folder",
        "run.startup",
        "run.wandb_logger",
    )
)


NAMES_PRUNING = f"""
import sys
from {PACKAGE}.cli.config import parse_fit_args
_, config = parse_fit_args(["--config", "configs/cifar10.yaml", "--config", "configs/callbacks/pruning.yaml"])
print([str(c.class_path) for c in config.trainer.callbacks])
"""


def test_a_config_that_names_an_optional_callback_imports_it():
    proc = subprocess.run(
        [sys.executable, "-c", NAMES_PRUNING], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0 and f"{PACKAGE}.compression.pruning.ProgressivePruning" in proc.stdout, (
        proc.stderr
    )
