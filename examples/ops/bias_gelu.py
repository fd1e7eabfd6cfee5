"""`bias_gelu(x, bias)`: GELU(x + bias) (tanh approximation) as one custom operator with its own backward.

Why a custom op at all: `x + bias` then GELU in eager PyTorch is several kernels, each reading and writing
the whole activation, and autograd keeps the intermediate `x + bias` alive for the backward. A fused
kernel reads `x` once, writes the output once, and its backward recomputes `x + bias` from the saved
inputs instead of storing it (the usual trade in fused activations: a little compute for memory).
Here the kernel bodies are plain PyTorch, so the example runs everywhere; a real project would put a
Triton, C++ or CUDA kernel in `_forward_kernel` / `_backward_kernel` and keep everything else as is.

The registration is what makes it a first-class operator rather than a Python function:

- `torch.library.custom_op` defines `torch.ops.project.bias_gelu` with a schema. `torch.compile` keeps it
  as one opaque node in the graph (no graph break, no tracing into the kernel).
- `register_fake` gives its output's shape/dtype/strides without running it, which `torch.compile`,
  `torch.export` and meta-device tracing need.
- `register_autograd` attaches the backward: `setup_context(ctx, inputs, output)` saves what the
  backward needs and `backward(ctx, grad)` returns one gradient per input (the same two methods as a
  `torch.autograd.Function`, registered on the operator so every PyTorch subsystem sees them; wrapping
  a custom op in a `torch.autograd.Function` instead is what PyTorch's docs warn against). The backward
  kernel is itself a custom op, so it is opaque to the compiler too.

`tests/test_ops.py` checks it against `bias_gelu_reference` and with `torch.autograd.gradcheck` (float64)
and `torch.library.opcheck` (schema, fake kernel, autograd registration, AOT dispatch).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def _check_inputs(x: Tensor, bias: Tensor) -> None:
    # torch._check works on real and fake tensors alike, so the fake kernel raises the same errors.
    torch._check(x.dim() >= 1, lambda: "bias_gelu: x must have at least one dimension")
    torch._check(
        bias.dim() == 1 and bias.shape[0] == x.shape[-1],
        lambda: (
            f"bias_gelu: bias must have shape ({x.shape[-1]},) (x's last dimension), got {tuple(bias.shape)}"
        ),
    )
    torch._check(
        x.dtype == bias.dtype and x.device == bias.device,
        lambda: (
            f"bias_gelu: x and bias must share dtype and device, got {x.dtype}/{x.device} and "
            f"{bias.dtype}/{bias.device}"
        ),
    )


def _gelu_parts(x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """y = x + bias and tanh(sqrt(2/pi) * (y + 0.044715 y^3)), in float32 at least (half inputs lose too much)."""
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    y = x.to(compute_dtype) + bias.to(compute_dtype)
    return y, torch.tanh(_SQRT_2_OVER_PI * (y + _CUBIC * y * y * y))


@torch.library.custom_op("project::bias_gelu", mutates_args=())
def _forward_kernel(x: Tensor, bias: Tensor) -> Tensor:
    _check_inputs(x, bias)
    y, t = _gelu_parts(x, bias)
    # A new contiguous tensor in x's dtype: exactly what the fake kernel below promises.
    return (0.5 * y * (1.0 + t)).to(x.dtype).contiguous()


@_forward_kernel.register_fake
def _(x: Tensor, bias: Tensor) -> Tensor:
    _check_inputs(x, bias)
    return x.new_empty(x.shape)


@torch.library.custom_op("project::bias_gelu_backward", mutates_args=())
def _backward_kernel(grad: Tensor, x: Tensor, bias: Tensor) -> Tensor:
    """dL/d(x + bias): grad * GELU'(x + bias), recomputing x + bias instead of having stored it."""
    y, t = _gelu_parts(x, bias)
    slope = 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _CUBIC * y * y)
    return (grad.to(slope.dtype) * slope).to(x.dtype).contiguous()


@_backward_kernel.register_fake
def _(grad: Tensor, x: Tensor, bias: Tensor) -> Tensor:
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    x, bias = inputs
    ctx.save_for_backward(x, bias)  # the inputs, not x + bias: the backward recomputes it


def _backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
    x, bias = ctx.saved_tensors
    grad_y = _backward_kernel(grad, x, bias)
    grad_x = grad_y if ctx.needs_input_grad[0] else None
    # The bias was broadcast over every leading dimension: its gradient sums over them (in float32 at least).
    grad_bias = None
    if ctx.needs_input_grad[1]:
        accumulate = torch.promote_types(grad_y.dtype, torch.float32)
        grad_bias = grad_y.reshape(-1, grad_y.shape[-1]).sum(dim=0, dtype=accumulate).to(bias.dtype)
    return grad_x, grad_bias


_forward_kernel.register_autograd(_backward, setup_context=_setup_context)


def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
    """GELU(x + bias) with the tanh approximation; `bias` has shape (x.shape[-1],), like a Linear layer's.

    Differentiable in `x` and `bias` (first derivatives; double backward is not implemented).
    """
    return _forward_kernel(x, bias)


def bias_gelu_reference(x: Tensor, bias: Tensor) -> Tensor:
    """The same function in stock PyTorch ops: what the custom op must match."""
    return F.gelu(x + bias, approximate="tanh")


class BiasGELU(nn.Module):
    """A learnable bias followed by GELU, fused: use after a `Linear(..., bias=False)`.

    Args:
        num_features: Size of the last dimension of the input (the bias's length).
    """

    def __init__(self, num_features: int) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"BiasGELU: num_features must be at least 1, got {num_features}")
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: Tensor) -> Tensor:
        return bias_gelu(x, self.bias)

    def extra_repr(self) -> str:
        return f"num_features={self.bias.numel()}"
