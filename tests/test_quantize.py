"""`python -m project quantize`: the INT8 table (Markdown, JSON, W&B) with figures that can be checked."""

import json
import shutil

import numpy as np
import pytest
import torch
from torchvision.datasets import CIFAR10

from project.cli import main
from project.compression.onnx_int8 import needs_reduce_range, quantize_static_int8
from project.errors import UserError
from project.export.quantize import quantize
from project.export.report import COLUMNS
from project.export.trained import load_trained
from tests.conftest import run_cli
from tests.deploy_helpers import mounted_tmpfs
from tests.folder_fits import tiny_fit_args, tiny_folder
from tests.wandb_reader import read_run

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported

ROWS = [
    "FP32 eager",
    "FP32 ONNX Runtime",
    "FP32 AOTInductor package",
    "dynamic INT8 (Linear layers)",
    "static INT8, calibrated on 3 training batches",
    "QAT INT8",
]


def _eager_test_accuracy(ckpt, data_dir) -> float:
    """Top-1 of the checkpoint on the fake CIFAR test split, computed without the quantize code."""
    trained = load_trained(ckpt)
    test = CIFAR10(data_dir, train=False, download=False)
    x = trained.preprocessing.normalize(torch.from_numpy(test.data).permute(0, 3, 1, 2))
    with torch.no_grad():
        pred = trained.net(x).argmax(1).numpy()
    return float((pred == np.array(test.targets)).mean())


@pytest.mark.slow
def test_quantize_report(trained_run, exported, tmp_path):
    # A run folder with a QAT artifact beside the checkpoint (an INT8 ONNX file stands in for one).
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(trained_run.ckpt, run / "checkpoints" / "last.ckpt")
    shutil.copy(trained_run.config, run / "config.yaml")
    calibration = (
        np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32) for _ in range(2)
    )
    quantize_static_int8(exported, run / "checkpoints" / "model-qat-int8.onnx", calibration)

    out = tmp_path / "report"
    proc = run_cli(
        "quantize", "--ckpt_path", run / "checkpoints" / "last.ckpt", "--output_dir", out,
        *trained_run.data_args, "--calibration_batches", "3", "--repeats", "3", "--warmup", "1", "--threads", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert {"model.onnx", "model.pt2", "model.json", "model.int8-dynamic.onnx", "model.int8-static.onnx"} <= {
        p.name for p in out.iterdir()
    }

    markdown = (out / "quantization.md").read_text()
    assert markdown.splitlines()[0] == "| " + " | ".join(COLUMNS) + " |"
    assert [line.split(" | ")[0].lstrip("| ") for line in markdown.splitlines()[2 : 2 + len(ROWS)]] == ROWS
    assert markdown in proc.stdout

    report = json.loads((out / "quantization.json").read_text())
    results = {r["variant"]: r for r in report["results"]}
    assert list(results) == ROWS and report["info"]["samples"] == 100 and report["info"]["threads"] == 1
    # Without --reduce_range the report says what this CPU got: 7-bit weights exactly when it lacks VNNI.
    assert ("7-bit weights" in report["info"]["calibration"]) == needs_reduce_range()
    # The FP32 figure is the checkpoint's real test accuracy; ONNX Runtime agrees with eager everywhere.
    assert results["FP32 eager"]["accuracy"] == pytest.approx(
        _eager_test_accuracy(trained_run.ckpt, trained_run.data_dir)
    )
    assert results["FP32 eager"]["accuracy"] > 0.5
    assert results["FP32 ONNX Runtime"]["agreement"] == 1.0
    # The AOTInductor package, timed beside ONNX Runtime, is the same network.
    aoti = results["FP32 AOTInductor package"]
    assert (
        aoti["agreement"] == 1.0
        and aoti["artifact"] == "model.pt2"
        and aoti["runtime"] == "AOTInductor (CPU)"
    )
    assert aoti["accuracy"] == results["FP32 eager"]["accuracy"]
    assert results["dynamic INT8 (Linear layers)"]["agreement"] >= 0.8
    assert results["static INT8, calibrated on 3 training batches"]["agreement"] >= 0.6
    for r in report["results"]:
        assert r["drop_points"] == pytest.approx(100 * (results["FP32 eager"]["accuracy"] - r["accuracy"]))
        assert r["latency_ms"] > 0 and r["throughput"] > 0 and r["size_mb"] > 0
    assert (
        results["static INT8, calibrated on 3 training batches"]["size_mb"]
        < 0.5 * results["FP32 ONNX Runtime"]["size_mb"]
    )
    assert results["QAT INT8"]["artifact"].endswith("model-qat-int8.onnx")

    # The same table reached W&B (offline run in the output folder).
    (wandb_run,) = (out / "wandb").glob("offline-run-*")
    recorded = read_run(wandb_run)
    (row,) = [row for row in recorded["history"] if row.get("quantization/_type") == "table-file"]
    assert row["quantization/nrows"] == len(ROWS) and row["quantization/ncols"] == len(COLUMNS)
    table = json.loads((wandb_run / "files" / row["quantization/path"]).read_text())
    assert table["columns"] == COLUMNS and [r[0] for r in table["data"]] == ROWS
    assert recorded["summary"]["fp32_eager/accuracy"] == pytest.approx(results["FP32 eager"]["accuracy"])


def _int8_weights(path) -> list[np.ndarray]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return [
        numpy_helper.to_array(t)
        for t in model.graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and t.dims
    ]


@pytest.mark.parametrize("reduce_range", [False, True])
def test_static_int8_weight_range(exported, tmp_path, reduce_range):
    """reduce_range reaches ONNX Runtime: 7-bit weights (|w| <= 64), which x86 U8S8 kernels without VNNI
    can multiply-add in int16 without saturating; without it the per-channel weights use all 8 bits."""
    calibration = (
        np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32) for _ in range(2)
    )
    out = tmp_path / "int8.onnx"
    quantize_static_int8(exported, out, calibration, reduce_range=reduce_range)
    weights = _int8_weights(out)
    assert weights, "no INT8 weight tensors in the static INT8 model"
    largest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert largest <= 64 if reduce_range else largest == 127


@pytest.mark.parametrize(
    ("machine", "flags", "expected"),
    [
        ("x86_64", "fpu sse2 avx2 fma", True),  # AVX2 only (this kind of CPU): int16 accumulation saturates
        ("x86_64", "fpu sse2 avx2 avx512f avx512_vnni", False),  # Cascade Lake and later
        ("AMD64", "fpu sse2 avx2 avx_vnni", False),  # Alder Lake's AVX-VNNI
        ("aarch64", "fp asimd", False),  # ARM kernels accumulate in int32
    ],
)
def test_needs_reduce_range(machine, flags, expected):
    cpuinfo = f"processor\t: 0\nvendor_id\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    assert needs_reduce_range(cpuinfo, machine) is expected


def test_quantize_rejects_bad_arguments(trained_run, tmp_path):
    with pytest.raises(UserError, match="--calibration_batches must be at least 1, got 0"):
        quantize(str(trained_run.ckpt), calibration_batches=0, output_dir=str(tmp_path / "q"))
    with pytest.raises(UserError, match=r"--qat_path .*nope\.pt2 does not exist"):
        quantize(str(trained_run.ckpt), qat_path=str(tmp_path / "nope.pt2"), output_dir=str(tmp_path / "q"))
    assert not (tmp_path / "q").exists()


@pytest.mark.slow
def test_quantize_on_data_without_a_test_split_says_so_in_one_line(tmp_path):
    """A flat class folder has no test split: the table is scored on the validation split and the one warning
    line says so, once, with no raw Python warning (file path and source line) beside it."""
    data = tiny_folder(tmp_path / "images")
    run_cli("fit", *tiny_fit_args(data, tmp_path, "--trainer.max_epochs", "1", "--trainer.logger", "false"),
            cwd=tmp_path)  # fmt: skip
    (ckpt,) = (tmp_path / "logs").glob("**/last.ckpt")
    proc = run_cli(
        "quantize", "--ckpt_path", ckpt, "--output_dir", tmp_path / "q", "--calibration_batches", "1",
        "--repeats", "1", "--warmup", "0", "--threads", "1", cwd=tmp_path,
    )  # fmt: skip
    printed = (proc.stdout + proc.stderr).splitlines()
    (warning,) = [line for line in printed if line.startswith("warning:")]
    assert warning.startswith("warning: the data has no test split: testing on the validation split")
    assert not [line for line in printed if "Warning:" in line or ".py:" in line]
    assert json.loads((tmp_path / "q" / "quantization.json").read_text())["info"]["split"] == "validation"
    assert "images of the validation split" in (tmp_path / "q" / "quantization.md").read_text()


def test_pt2e_static_int8_artifact(tmp_path, monkeypatch):
    """torchao PT2E static INT8: saved as a .pt2, reloaded, close to the float network; and when
    torch.compile fails on this torch build, it runs uncompiled with a warning instead of failing."""
    from project.compression import int8_program
    from project.compression.int8_program import load_int8, save_int8
    from project.compression.pt2e import quantize_static
    from project.export.int8_variants import load_int8_runtime
    from project.models import SimpleCNN

    torch.manual_seed(0)
    net = SimpleCNN(num_classes=4, width=8, hidden=16).eval()
    rng = np.random.default_rng(0)
    calibration = [rng.standard_normal((16, 3, 32, 32)).astype(np.float32) for _ in range(3)]
    path = tmp_path / "model.int8-pt2e.pt2"
    example = torch.zeros(2, 3, 32, 32)
    save_int8(
        quantize_static(net, (torch.from_numpy(b) for b in calibration), example),
        path,
        example,
        {"class_names": list("abcd")},
    )
    assert load_int8(path)[1]["class_names"] == list("abcd")

    runtime, how = load_int8_runtime(path, (3, 32, 32), compile=False)
    assert how == "torch.export program, uncompiled"
    x = calibration[0]
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    got = runtime(x)
    assert got.shape == expected.shape and (got.argmax(1) == expected.argmax(1)).mean() >= 0.75
    assert np.abs(got - expected).max() < 0.1 * np.abs(expected).max()

    def broken_compile(module):
        def run(x):
            raise RuntimeError("no INT8 kernels here")

        return run

    monkeypatch.setattr(int8_program, "compile_int8", broken_compile)
    with pytest.warns(UserWarning, match="torch.compile of the INT8 program failed .*no INT8 kernels here"):
        runtime, how = load_int8_runtime(path, (3, 32, 32))
    assert how.startswith("uncompiled: torch.compile failed") and runtime(x).shape == expected.shape


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_a_full_disk_is_one_line_and_leaves_no_file_half_written(trained_run, exported, tmp_path, capsys):
    """A disk with room for the FP32 export (written first) and not for the INT8 models."""
    page = 4096
    room = page + sum(
        -(-f.stat().st_size // page) * page for f in (exported, exported.with_name("model.json"))
    )
    with mounted_tmpfs(tmp_path / "disk", room) as disk:
        out = disk / "report"
        with pytest.raises(SystemExit) as stop:
            main(
                [
                    "quantize", "--ckpt_path", str(trained_run.ckpt), "--output_dir", str(out),
                    *trained_run.data_args, "--aoti", "false", "--wandb", "false", "--calibration_batches", "1",
                    "--limit_batches", "1", "--repeats", "1", "--warmup", "0",
                ]
            )  # fmt: skip
        assert stop.value.code == 1
        line = _one_error_line(capsys)
        assert line.startswith(f"error: no space left on the device to write {out}")
        assert line.endswith(
            "no file there is half-written. Free some space, then run the same command again with --overwrite true"
        )
        assert sorted(p.name for p in out.iterdir()) == [
            "model.json",
            "model.onnx",
        ]  # no INT8 model, no staging
        assert not list(disk.glob(".*"))
        import onnx

        onnx.checker.check_model(str(out / "model.onnx"), full_check=True)  # whole


def test_an_int8_program_on_a_full_disk_is_an_os_error_and_leaves_nothing(tmp_path):
    """torch.export.save itself would end the process (its C++ writer raises, then terminates)."""
    import errno

    from project.compression.int8_program import save_int8
    from project.models import SimpleCNN

    net = SimpleCNN(num_classes=4, width=8, hidden=16).eval()
    example = torch.zeros(2, 3, 32, 32)
    with mounted_tmpfs(tmp_path / "disk", 16 * 1024) as disk:
        with pytest.raises(OSError) as raised:
            save_int8(net, disk / "model.int8-pt2e.pt2", example, {"class_names": list("abcd")})
        assert raised.value.errno == errno.ENOSPC
        assert list(disk.iterdir()) == []
