"""The custom operator example: matches its reference, passes gradcheck and opcheck, works under torch.compile."""

import pytest
import torch

from examples.ops import BiasGELU, bias_gelu, bias_gelu_reference

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def sample_inputs(
    device: str = "cpu", dtype: torch.dtype = torch.float32
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Shapes a network produces (2-D, 4-D), a 1-D edge case and a non-contiguous input; large values too."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 3).to(device=device, dtype=dtype)

    return [
        (rand(8, 16), rand(16)),
        (rand(2, 3, 5, 7), rand(7)),
        (rand(5), rand(5)),
        (rand(16, 6).t(), rand(16)),  # transposed: not contiguous
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_forward_and_backward(dtype):
    for x, b in sample_inputs(dtype=dtype):
        x.requires_grad_(True)
        b.requires_grad_(True)
        out = bias_gelu(x, b)
        ref = bias_gelu_reference(x, b)
        torch.testing.assert_close(out, ref)
        assert out.dtype == x.dtype and out.shape == x.shape
        grad = torch.randn_like(out)
        got = torch.autograd.grad(out, (x, b), grad)
        want = torch.autograd.grad(ref, (x, b), grad)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


def test_low_precision_is_computed_in_float32():
    x, b = sample_inputs()[0]
    out = bias_gelu(x.bfloat16(), b.bfloat16())
    assert out.dtype == torch.bfloat16
    # One rounding to bfloat16 at the end, not one per intermediate step.
    torch.testing.assert_close(
        out, bias_gelu_reference(x.bfloat16().float(), b.bfloat16().float()).bfloat16()
    )


def test_gradcheck_in_double_precision():
    for x, b in sample_inputs(dtype=torch.float64):
        assert torch.autograd.gradcheck(bias_gelu, (x.requires_grad_(), b.requires_grad_()))


def test_gradient_only_where_asked():
    x, b = sample_inputs()[0]
    x.requires_grad_(True)
    bias_gelu(x, b).sum().backward()
    assert x.grad is not None and b.grad is None


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(requires_grad):
    # Schema (no mutation, no aliasing), fake kernel vs real outputs, autograd registration, AOT dispatch.
    for x, b in sample_inputs():
        torch.library.opcheck(
            torch.ops.project.bias_gelu.default,
            (x.requires_grad_(requires_grad), b.requires_grad_(requires_grad)),
        )
        grad = torch.randn(x.shape)
        torch.library.opcheck(torch.ops.project.bias_gelu_backward.default, (grad, x.detach(), b.detach()))


def test_compile_keeps_the_op_as_one_node_without_graph_breaks():
    graphs = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    layer = torch.nn.Sequential(torch.nn.Linear(16, 8, bias=False), BiasGELU(8))
    compiled = torch.compile(layer, backend=recording_backend, fullgraph=True)
    x = torch.randn(4, 16)
    torch.testing.assert_close(compiled(x), layer(x))
    (graph,) = graphs
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert "project.bias_gelu.default" in targets


def test_compiled_forward_and_backward_match_eager():
    # aot_eager runs AOTAutograd (fake tensors, the joint forward/backward graph) without building C++.
    torch._dynamo.reset()
    x, b = sample_inputs()[1]
    compiled = torch.compile(bias_gelu, backend="aot_eager", fullgraph=True)
    xe, be = x.clone().requires_grad_(), b.clone().requires_grad_()
    xc, bc = x.clone().requires_grad_(), b.clone().requires_grad_()
    torch.testing.assert_close(compiled(xc, bc), bias_gelu(xe, be))
    compiled(xc, bc).pow(2).sum().backward()
    bias_gelu(xe, be).pow(2).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(bc.grad, be.grad)


def test_module_trains():
    torch.manual_seed(0)
    layer = BiasGELU(4)
    assert torch.equal(layer.bias, torch.zeros(4)) and "num_features=4" in repr(layer)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    x, target = torch.zeros(32, 4), torch.full((32, 4), 1.0)
    for _ in range(50):
        optimizer.zero_grad()
        loss = (layer(x) - target).pow(2).mean()
        loss.backward()
        optimizer.step()
    # The bias moved to where GELU(bias) = 1 (by the stock-PyTorch formula, about 1.14).
    assert loss.item() < 1e-4
    reached = bias_gelu_reference(torch.zeros(4), layer.bias.detach())
    torch.testing.assert_close(reached, torch.ones(4), atol=1e-2, rtol=0)
    assert torch.all(layer.bias > 1.1)


@pytest.mark.parametrize(
    ("x", "b", "message"),
    [
        (torch.zeros(2, 3), torch.zeros(4), r"bias must have shape \(3,\)"),
        (torch.zeros(2, 3), torch.zeros(1, 3), r"bias must have shape \(3,\)"),
        (torch.zeros(2, 3), torch.zeros(3, dtype=torch.float64), "must share dtype and device"),
    ],
)
def test_bad_inputs_fail_clearly(x, b, message):
    with pytest.raises(RuntimeError, match=message):
        bias_gelu(x, b)


def test_module_rejects_bad_size():
    with pytest.raises(ValueError, match="num_features"):
        BiasGELU(0)


@cuda
def test_cuda_matches_reference_and_passes_opcheck():
    for x, b in sample_inputs(device="cuda"):
        torch.testing.assert_close(bias_gelu(x, b), bias_gelu_reference(x, b))
        torch.library.opcheck(torch.ops.project.bias_gelu.default, (x.requires_grad_(), b.requires_grad_()))


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_inductor_compile_matches_eager(device):
    # The default backend, forward and backward (builds C++ with the machine's compiler on CPU: ~15-50 s).
    torch._dynamo.reset()
    x, b = sample_inputs(device=device)[1]
    xe, be = x.clone().requires_grad_(), b.clone().requires_grad_()
    xc, bc = x.clone().requires_grad_(), b.clone().requires_grad_()
    out = torch.compile(bias_gelu, fullgraph=True)(xc, bc)
    torch.testing.assert_close(out, bias_gelu(xe, be))
    out.sum().backward()
    bias_gelu(xe, be).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(bc.grad, be.grad)
