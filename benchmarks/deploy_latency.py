"""Latency and throughput of the ways to deploy a network on the CPU: eager PyTorch, `torch.compile`, ONNX Runtime
and the AOTInductor package (`export --format aoti`), plus the package's load time and size.

For each network (the folder recipe's ResNet-18 on 64 x 64 inputs, configs/folder.yaml; the seed's SimpleCNN on
32 x 32, configs/sample.yaml; untrained weights: speed does not depend on their values), every variant is built
first (exported, compiled and warmed up, untimed), then timed interleaved: each repeat runs every variant once,
in turn, at batch 1 (latency, median ms) and at `--batch_size` (throughput, images/s from the median batch
time), as the quantization report times its rows (project/export/report.py). The package's load time is the
median of `--loads` calls of `torch._inductor.aoti_load_package` (it unzips the package and dlopens its
library). Prints one JSON line per network and variant, then one per package, then
`ratio: X` = the AOTInductor package's ResNet-18 throughput over ONNX Runtime's.

    python -m benchmarks.deploy_latency --repeats 30 --warmup 5 --loads 10

A check that it runs (not a measurement): `--networks simplecnn --repeats 2 --warmup 1 --batch_size 4 --loads 2`.
"""

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks.common import emit, machine
from project.export.aoti import export_aoti
from project.export.model_export import export_onnx
from project.export.report import speed
from project.export.runtimes import AotiRuntime, OnnxRuntime, Runtime, TorchRuntime
from project.models import SimpleCNN, TorchvisionNet

#: name -> (the network as its recipe builds it, its input (C, H, W), the recipe).
NETWORKS: dict[str, tuple[Callable[[], nn.Module], tuple[int, int, int], str]] = {
    "resnet18": (lambda: TorchvisionNet("resnet18", num_classes=10), (3, 64, 64), "configs/folder.yaml"),
    "simplecnn": (lambda: SimpleCNN(num_classes=10), (3, 32, 32), "configs/sample.yaml"),
}


class CompiledRuntime:
    """`torch.compile` (Inductor, default mode) of the eval network, under inference mode."""

    def __init__(self, net: nn.Module) -> None:
        self.compiled = torch.compile(net)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.compiled(torch.from_numpy(x)).float().numpy()


def build(name: str, folder: Path, threads: int) -> tuple[dict[str, Runtime], dict]:
    """The four variants of network `name` (exports written into `folder`), and the package's facts."""
    make, shape, recipe = NETWORKS[name]
    torch.manual_seed(0)
    net = make().eval()
    onnx_path, package = folder / f"{name}.onnx", folder / f"{name}.pt2"
    export_onnx(net, shape, onnx_path)
    start = time.perf_counter()
    export_aoti(net, shape, package)
    compile_s = time.perf_counter() - start
    runtimes: dict[str, Runtime] = {
        "eager": TorchRuntime(net),
        "torch.compile": CompiledRuntime(net),
        "onnxruntime": OnnxRuntime(onnx_path, threads),
        "aoti": AotiRuntime(package, "cpu", threads),
    }
    facts = {"recipe": recipe, "input": list(shape), "package": package, "compile_s": round(compile_s, 1)}
    return runtimes, facts


def load_ms(package: Path, loads: int) -> float:
    """Median milliseconds of `aoti_load_package` (each call unzips the package and loads its library anew)."""
    times = []
    for _ in range(loads):
        start = time.perf_counter()
        torch._inductor.aoti_load_package(str(package))
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--networks", default="resnet18,simplecnn", help="comma-separated: resnet18, simplecnn"
    )
    parser.add_argument("--batch_size", type=int, default=64, help="batch of the throughput measurement")
    parser.add_argument("--repeats", type=int, default=30, help="timed runs per variant and batch size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per variant before timing")
    parser.add_argument("--loads", type=int, default=10, help="timed loads of each package")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    args = parser.parse_args()
    names = [n.strip() for n in args.networks.split(",") if n.strip()]
    unknown = sorted(set(names) - set(NETWORKS))
    if unknown:
        parser.error(f"unknown network(s) {', '.join(unknown)}; choose from {', '.join(NETWORKS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    emit(benchmark="deploy_latency", machine=machine(), batch_size=args.batch_size, repeats=args.repeats)

    throughput: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="deploy_latency-") as tmp:
        for name in names:
            runtimes, facts = build(name, Path(tmp), threads)
            sample = np.random.default_rng(0).standard_normal(
                (args.batch_size, *facts["input"]), dtype=np.float32
            )
            figures = speed(runtimes, sample, args.batch_size, warmup=args.warmup, repeats=args.repeats)
            for variant, measured in figures.items():
                throughput[name, variant] = measured["throughput"]
                emit(
                    network=name,
                    variant=variant,
                    latency_ms=round(measured["latency_ms"], 3),
                    throughput=round(measured["throughput"], 1),
                )
            package = facts.pop("package")
            emit(
                network=name,
                package_mb=round(package.stat().st_size / 2**20, 2),
                load_ms=round(load_ms(package, args.loads), 1),
                **facts,
            )
    reference = "resnet18" if "resnet18" in names else names[0]
    print(f"ratio: {throughput[reference, 'aoti'] / throughput[reference, 'onnxruntime']:.2f}")


if __name__ == "__main__":
    main()
