"""Custom operators: kernels registered with `torch.library`, so autograd, `torch.compile` and export see them.

`bias_gelu` is the worked example: one fused bias-add + GELU, with a hand-written backward. Copy its
pattern (kernel op, fake kernel, autograd formula, opcheck/gradcheck tests) for your own kernels.
"""

from examples.ops.bias_gelu import BiasGELU, bias_gelu, bias_gelu_reference

__all__ = ["BiasGELU", "bias_gelu", "bias_gelu_reference"]
