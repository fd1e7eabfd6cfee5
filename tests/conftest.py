import os
import subprocess
import sys
from pathlib import Path

import pytest

import project
from tests.fakes import make_fake_cifar, make_image_folder, patch_cifar_integrity


@pytest.fixture(autouse=True)
def _rank_zero_is_restored():
    """A Trainer built in-process as another rank (the SLURM test builds rank 1 of 2) sets Lightning's global
    `rank_zero_only.rank`; left there, every later test's loggers and rank-zero warnings would go silent."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

    saved = [(fn, getattr(fn, "rank", None)) for fn in (rank_zero_only, utils_rank_zero_only)]
    yield
    for fn, rank in saved:
        if rank is None:
            vars(fn).pop("rank", None)
        else:
            fn.rank = rank


ROOT = Path(__file__).resolve().parent.parent
#: The package under test, as `python -m` and imports name it (a renamed copy of the template changes no test).
PACKAGE = project.__name__
CONFIGS = ROOT / "configs"

# Offline, quiet W&B for every test, whatever the developer's shell says.
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"


@pytest.fixture(scope="session")
def fake_cifar(tmp_path_factory) -> Path:
    """A fake CIFAR-10 (500 train, 100 test images) in the real file format; integrity check patched."""
    patch_cifar_integrity()
    return make_fake_cifar(tmp_path_factory.mktemp("cifar"))


@pytest.fixture
def image_folder(tmp_path) -> Path:
    """3 classes x 12 images of mixed sizes and modes, plus one non-image and one corrupt file."""
    return make_image_folder(tmp_path / "images")


def newest_run(root: Path) -> Path:
    """The folder of the newest run under the trainer.default_root_dir `root`: `root/runs/version_N`."""
    runs = sorted((root / "runs").glob("version_*"), key=lambda p: int(p.name.removeprefix("version_")))
    assert runs, f"no run folder under {root}/runs"
    return runs[-1]


def subprocess_env() -> dict[str, str]:
    """The environment of a `python -m project` child: the checkout importable, and its own W&B service (an
    in-process run in this test process leaves WANDB_SERVICE set, and a child joining that service and then
    killed would leave its run id taken there)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("WANDB_SERVICE", None)
    return env


def run_cli(*args: str, cwd: Path, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m project <args>` in a subprocess (with the fake-CIFAR checksum patch)."""
    return run_python(str(ROOT / "tests" / "patched_main.py"), *args, cwd=cwd, check=check, timeout=timeout)


def run_python(
    *args: object, cwd: Path = ROOT, check: bool = True, timeout: int = 300
) -> subprocess.CompletedProcess:
    """`python <args>` in a subprocess with the checkout importable; with `check`, a non-zero exit fails the
    test with the end of both outputs."""
    proc = subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc
