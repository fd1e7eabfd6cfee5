"""Debug presets (configs/debug/*.yaml): each runs on the CPU stacked on cifar10.yaml, and finds what it is for."""

import pickle
import re
from pathlib import Path

import pytest
import torch
import yaml

from project.callbacks.debug.memory import CUDAMemoryRecorder
from project.cli import Run, run_command
from project.models import MLP
from tests.conftest import CONFIGS, newest_run
from tests.tiny_fit import command_args, readme_commands, tiny_args

PRESETS = sorted(p.name for p in (CONFIGS / "debug").glob("*.yaml"))
COMMANDS = {
    name: f"python -m project fit --config configs/cifar10.yaml --config configs/debug/{name}"
    for name in PRESETS
}
# Presets that run long by design are cut to a few steps (later flags win).
SHORT = [
    "--trainer.max_epochs",
    "1",
    "--trainer.limit_train_batches",
    "4",
    "--trainer.limit_val_batches",
    "2",
]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class GuardedLogMLP(MLP):
    """The MLP plus a log of zero guarded by `torch.where`: the loss stays finite, log's gradient is 0 / 0 = NaN.

    `where` hands the branch it did not pick an exact zero gradient, and log's backward divides it by its exact
    zero input, so `LogBackward0` is the one operation that can turn the gradient NaN, whatever the CPU's kernels
    (a norm of a zero vector is not: its NaN came from sqrt or from pow depending on a sum's rounding).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        zero = logits - logits.detach()
        return logits + torch.where(zero == 0, zero, zero.log())


class OOMAtBatch(MLP):
    """The MLP, failing like CUDA out of memory at its `at`-th training batch."""

    def __init__(self, num_classes: int = 10, at: int = 6, hidden: int = 32) -> None:
        super().__init__(num_classes=num_classes, hidden=hidden)
        self.at, self.seen = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen += 1
            if self.seen == self.at:
                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 8.00 GiB total)"
                )
        return super().forward(x)


def run(name: str, data: Path, root: Path, *extra: str) -> Run:
    return run_command(command_args(COMMANDS[name]) + tiny_args(data, root) + list(extra))


def test_readme_debug_commands_are_the_tested_ones():
    assert set(readme_commands("configs/debug/")) <= set(COMMANDS.values())


def test_the_presets():
    assert PRESETS == ["anomaly.yaml", "fast.yaml", "memory.yaml", "overfit.yaml", "profile.yaml"]
    # configs/debug.yaml (named in the README's first steps) and the fast preset say the same.
    assert yaml.safe_load((CONFIGS / "debug" / "fast.yaml").read_text()) == yaml.safe_load(
        (CONFIGS / "debug.yaml").read_text()
    )


def test_fast(fake_cifar, tmp_path):
    cli = run("fast.yaml", fake_cifar, tmp_path)
    assert cli.trainer.state.finished and cli.trainer.global_step == 4
    assert cli.trainer.loggers == [] and cli.trainer.precision == "32-true"
    assert (newest_run(tmp_path) / "checkpoints" / "last.ckpt").exists()


def test_overfit_runs_a_few_steps_without_augmentation(fake_cifar, tmp_path):
    cli = run("overfit.yaml", fake_cifar, tmp_path, *SHORT)
    assert cli.trainer.overfit_batches == 4 and cli.trainer.global_step == 4
    data = cli.datamodule
    assert (data.augment.crop_padding, data.augment.flip, data.augment.cutout) == (0, False, 0)
    assert cli.model.hparams.label_smoothing == 0.0
    assert all(group["weight_decay"] == 0.0 for group in cli.trainer.optimizers[0].param_groups)


def test_overfit_memorises_its_batches(fake_cifar, tmp_path):
    # What a healthy model does under the preset: 2 fixed batches of 16 learnt perfectly. (The recipe's
    # max_lr of 0.2 is for the ResNet: the MLP diverges with it, which this preset would show too.)
    args = [
        "--trainer.overfit_batches",
        "2",
        "--trainer.max_epochs",
        "25",
        "--model.scheduler.init_args.max_lr",
        "0.02",
    ]
    cli = run("overfit.yaml", fake_cifar, tmp_path, *args)
    metrics = cli.trainer.callback_metrics
    assert metrics["train/acc"].item() == pytest.approx(1.0) and metrics["train/loss"] < 0.01


def test_anomaly_names_the_operation_whose_gradient_is_nan(fake_cifar, tmp_path, recwarn):
    nan_net = ["--model.net", f"{__name__}.GuardedLogMLP", "--model.net.hidden", "32"]
    with pytest.raises(RuntimeError, match=r"Function 'LogBackward0' returned nan values in its 0th output"):
        run("anomaly.yaml", fake_cifar, tmp_path, *SHORT, *nan_net)
    # ... and shows where that operation ran in the forward pass: the line to fix.
    (traceback,) = [str(w.message) for w in recwarn if "Traceback of forward call" in str(w.message)]
    assert "return logits + torch.where(zero == 0, zero, zero.log())" in traceback


def test_anomaly_runs_a_few_steps(fake_cifar, tmp_path):
    cli = run("anomaly.yaml", fake_cifar, tmp_path, *SHORT)
    assert cli.trainer.global_step == 4 and cli.trainer._detect_anomaly and cli.trainer.precision == "32-true"


def test_profile_writes_traces_and_a_table(fake_cifar, tmp_path, capsys):
    schedule = ["--trainer.profiler.init_args.wait", "1", "--trainer.profiler.init_args.warmup", "1"]
    cli = run(
        "profile.yaml", fake_cifar, tmp_path, *SHORT, *schedule, "--trainer.profiler.init_args.active", "2",
        "--trainer.limit_val_batches", "1",  # a validation shorter than the schedule does not end the recording
    )  # fmt: skip
    assert cli.trainer.global_step == 4
    folder = newest_run(tmp_path) / "profiler"  # in the run's log directory
    (trace,) = folder.glob("*training_step*.pt.trace.json")
    events = yaml.safe_load(trace.read_text())["traceEvents"]  # JSON is YAML
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) >= 2  # the two active steps (and the end of the warm-up one)
    assert "[pl][module]project.models.mlp.MLP: net" in {e.get("name") for e in events}
    table = (folder / "fit-profile.txt").read_text()
    assert "FIT Profiler Report" in table
    assert re.search(r"ProfilerStep\*.* 2 *\n", table), table[:2000]  # the two recorded training steps
    out = capsys.readouterr().out
    assert f"in {folder} (open one at https://ui.perfetto.dev)" in out


def test_memory_on_cpu_says_it_needs_cuda(fake_cifar, tmp_path):
    with pytest.warns(UserWarning, match=r"CUDAMemoryRecorder \(configs/debug/memory.yaml\) needs CUDA"):
        cli = run("memory.yaml", fake_cifar, tmp_path, *SHORT)
    assert cli.trainer.global_step == 4 and not list(tmp_path.glob("*.pickle"))


class FakeCUDAMemory:
    """Stands in for torch.cuda's memory functions, recording how the callback uses them."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record_memory_history(self, enabled: str | None = "all", **kwargs) -> None:
        self.calls.append(("record", enabled, kwargs.get("max_entries")))

    def dump_snapshot(self, path: str) -> None:
        Path(path).write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
        self.calls.append(("dump", Path(path).name))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(CUDAMemoryRecorder, "_uses_cuda", staticmethod(lambda trainer: True))
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", self.record_memory_history)
        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", self.dump_snapshot)
        monkeypatch.setattr(torch.cuda, "memory_summary", lambda device, abbreviated: "FAKE MEMORY SUMMARY")
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 1024**3)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 4 * 1024**3)


def test_memory_records_dumps_summarises_and_dumps_on_oom(fake_cifar, tmp_path, capsys, monkeypatch):
    # Everything but the CUDA calls themselves: when recording starts, when and where it dumps, the
    # per-epoch summary and peaks, and the dump when the run dies of OOM (at batch 6, in the 2nd epoch).
    fake = FakeCUDAMemory()
    fake.install(monkeypatch)
    oom_net = ["--model.net", f"{__name__}.OOMAtBatch", "--model.net.at", "6"]
    args = [*SHORT, "--trainer.max_epochs", "2", "--trainer.callbacks.snapshot_step", "3", *oom_net]
    with pytest.raises(torch.OutOfMemoryError):
        run("memory.yaml", fake_cifar, tmp_path, *args)
    assert fake.calls == [
        ("record", "all", 100_000),
        ("dump", "memory_snapshot_step3.pickle"),
        ("dump", "memory_snapshot_oom.pickle"),
        ("record", None, None),
    ]
    out = capsys.readouterr().out
    assert out.count("FAKE MEMORY SUMMARY") == 1  # after the first epoch
    run_dir = newest_run(tmp_path)  # the run's log directory
    assert f"CUDA memory snapshot: {run_dir / 'memory_snapshot_oom.pickle'}" in out
    assert (run_dir / "memory_snapshot_step3.pickle").exists()


def test_memory_logs_peaks_and_can_stop_recording(fake_cifar, tmp_path, monkeypatch):
    fake = FakeCUDAMemory()
    fake.install(monkeypatch)
    args = ["--trainer.callbacks.snapshot_step", "2", "--trainer.callbacks.keep_recording", "false"]
    cli = run("memory.yaml", fake_cifar, tmp_path, *SHORT, *args)
    # Recording stops right after the dump, not at the end of the run.
    assert fake.calls == [
        ("record", "all", 100_000),
        ("dump", "memory_snapshot_step2.pickle"),
        ("record", None, None),
    ]
    assert cli.trainer.callback_metrics["memory/max_allocated_gib"] == 3.0
    assert cli.trainer.callback_metrics["memory/max_reserved_gib"] == 4.0


@cuda
def test_memory_on_cuda_writes_a_snapshot_for_memory_viz(fake_cifar, tmp_path, capsys):
    on_gpu = ["--trainer.accelerator", "gpu", "--trainer.callbacks.snapshot_step", "3"]
    cli = run("memory.yaml", fake_cifar, tmp_path, *SHORT, *on_gpu)
    snapshot = pickle.loads((tmp_path / "memory_snapshot_step3.pickle").read_bytes())
    assert snapshot["segments"] and snapshot["device_traces"]
    assert "PyTorch CUDA memory summary" in capsys.readouterr().out
    assert cli.trainer.callback_metrics["memory/max_allocated_gib"] > 0
