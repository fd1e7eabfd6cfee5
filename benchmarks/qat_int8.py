"""INT8 after quantization-aware training against FP32, on this CPU; and the two QAT paths compared.

Why the template's QAT callback uses torchao's PT2E flow rather than `torch.ao.quantization`: this script
measures both on the same network and weights, after the same few QAT steps (so observers are calibrated):

  fp32_eager          the float network
  fp32_compiled       torch.compile(float network)
  pt2e_int8_eager     torchao PT2E (X86InductorQuantizer, prepare_qat_pt2e, convert_pt2e): the INT8 model as
                      saved by the callback, run as is (quantize/dequantize around float kernels)
  pt2e_int8_compiled  the same INT8 model under torch.compile with freezing (`project.compression.int8_program.compile_int8`):
                      Inductor turns the q/dq patterns into oneDNN INT8 kernels
  ao_eager_int8       torch.ao.quantization eager QAT (fuse, prepare_qat, convert; x86 backend): deprecated in
                      torch 2.14, and it needs the network rewritten with QuantStubs and FloatFunctional adds
                      (torchvision's QuantizableResNet is used for CIFARResNet; SimpleCNN is wrapped)

For each: images/s at batch `--batch` (median of `--repeats` timed runs after warm-up), the first call's
time (compilation), top-1 agreement with its fake-quantized model on a random batch (a randomly initialised
network's logits are nearly tied, so this is a loose check; on a trained model it is 99%+), and how many
DeprecationWarnings its API emitted. Prints one JSON
line per variant, then `ratio: X` = pt2e_int8_compiled / fp32_eager throughput.

    python -m benchmarks.qat_int8 --net SimpleCNN
    python -m benchmarks.qat_int8 --net CIFARResNet --batch 64 --repeats 10
"""

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torchvision.models.quantization.resnet import QuantizableBasicBlock, QuantizableResNet

from benchmarks.common import emit, machine
from project.compression import int8_program, pt2e
from project.models import CIFARResNet, SimpleCNN


def deprecations(fn: Callable[[], object]) -> tuple[object, int]:
    """Runs fn; returns its result and how many DeprecationWarnings (incl. FutureWarning) it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, sum(issubclass(w.category, DeprecationWarning | FutureWarning) for w in caught)


def train_steps(model: nn.Module, steps: int, batch: int, shape: tuple[int, ...], seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    for _ in range(steps):
        x = torch.randn(batch, *shape, generator=generator)
        y = torch.randint(0, 10, (batch,), generator=generator)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@torch.inference_mode()
def throughput(model: Callable, x: torch.Tensor, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        model(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(x)
        times.append(time.perf_counter() - start)
    return len(x) / statistics.median(times)


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.argmax(1) == b.argmax(1)).float().mean().item()


class AoSimpleCNN(nn.Module):
    """SimpleCNN with the QuantStub/DeQuantStub eager-mode quantization needs."""

    def __init__(self, net: SimpleCNN) -> None:
        super().__init__()
        self.quant, self.net, self.dequant = (
            torch.ao.quantization.QuantStub(),
            net,
            torch.ao.quantization.DeQuantStub(),
        )

    def forward(self, x):
        return self.dequant(self.net(self.quant(x)))

    def fuse_model(self, is_qat: bool) -> None:
        fuse = torch.ao.quantization.fuse_modules_qat if is_qat else torch.ao.quantization.fuse_modules
        fuse(
            self.net,
            [["features.0", "features.1"], ["features.3", "features.4"], ["classifier.1", "classifier.2"]],
            inplace=True,
        )


def ao_network(name: str, float_net: nn.Module) -> nn.Module:
    """The same network and weights, rewritten for eager-mode torch.ao quantization."""
    if name == "SimpleCNN":
        return AoSimpleCNN(copy.deepcopy(float_net))
    model = QuantizableResNet(QuantizableBasicBlock, [2, 2, 2, 2], num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    model.load_state_dict(float_net.state_dict())
    return model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--net", choices=["SimpleCNN", "CIFARResNet"], default="SimpleCNN")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--qat_steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = (3, 32, 32)
    float_net = (
        SimpleCNN() if args.net == "SimpleCNN" else CIFARResNet(depth=18, zero_init_residual=False)
    ).eval()
    x = torch.randn(args.batch, *shape)
    info = {"net": args.net, "batch": args.batch, **machine()}
    results = {}

    def report(variant: str, model: Callable, first: float | None = None, **extra) -> None:
        if first is None:
            start = time.perf_counter()
            model(x)  # first call: compilation, when there is one
            first = time.perf_counter() - start
        results[variant] = throughput(model, x, args.repeats)
        emit(
            variant=variant,
            images_per_s=round(results[variant], 1),
            first_call_s=round(first, 2),
            **extra,
            **info,
        )

    report("fp32_eager", float_net)
    report("fp32_compiled", torch.compile(float_net))

    # torchao PT2E, as the QuantizationAwareTraining callback does it.
    net = copy.deepcopy(float_net)
    prepared, warned = deprecations(lambda: pt2e.prepare_qat(net, torch.zeros(2, *shape)))
    train_steps(prepared, args.qat_steps, 32, shape)
    pt2e.freeze_observers(prepared)
    prepared.eval()
    int8, warned_convert = deprecations(lambda: pt2e.convert(prepared))
    with torch.inference_mode():
        reference = prepared(x)
        same = agreement(int8(x), reference)
    report(
        "pt2e_int8_eager", int8, agreement_with_fake_quant=same, deprecation_warnings=warned + warned_convert
    )
    compiled = int8_program.compile_int8(int8)
    start = time.perf_counter()
    with torch.inference_mode():
        same = agreement(compiled(x), reference)  # the first call compiles
    report(
        "pt2e_int8_compiled",
        compiled,
        time.perf_counter() - start,
        agreement_with_fake_quant=same,
        deprecation_warnings=warned + warned_convert,
    )

    # The deprecated eager path, for comparison.
    def ao_prepare() -> nn.Module:
        model = ao_network(args.net, float_net).train()
        model.fuse_model(is_qat=True)
        model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
        return torch.ao.quantization.prepare_qat(model)

    torch.backends.quantized.engine = "x86"
    ao_prepared, warned = deprecations(ao_prepare)
    train_steps(ao_prepared, args.qat_steps, 32, shape)
    ao_prepared.apply(torch.ao.quantization.disable_observer)
    ao_prepared.eval()
    ao_int8, warned_convert = deprecations(lambda: torch.ao.quantization.convert(ao_prepared))
    with torch.inference_mode():
        same = agreement(ao_int8(x), ao_prepared(x))
    report(
        "ao_eager_int8", ao_int8, agreement_with_fake_quant=same, deprecation_warnings=warned + warned_convert
    )

    print(f"ratio: {results['pt2e_int8_compiled'] / results['fp32_eager']:.2f}")


if __name__ == "__main__":
    main()
