"""INT8 quantization with torchao's PT2E flow: capture, prepare (QAT or calibration), train/eval, convert.

`torch.ao.quantization` (eager and FX) is deprecated and prints DeprecationWarnings in torch 2.14; its
maintained successor is torchao's PT2E flow: `torch.export` captures the network as an ATen graph,
`X86InductorQuantizer` annotates it for the x86 INT8 backend (per-channel symmetric int8 weights, per-tensor
uint8 activations, conv+BN(+add)(+ReLU) fused patterns), `prepare_qat_pt2e` folds BatchNorm into the
convolutions' fake quantization and inserts fake-quantize modules, and `convert_pt2e` produces the INT8 graph
(quantize/dequantize ops around float ops, which `torch.compile` with freezing lowers to INT8 kernels).

The prepared graph shares its Parameter objects with the eager network it was captured from, so an optimizer
built for the eager network keeps training it, and its parameter names (`layer1.0.conv1.weight`, ...) are the
eager ones: a float checkpoint is the prepared model's state minus the fake-quantize state. Saving, loading
and compiling the converted graph is `project.compression.int8_program`.
"""

import contextlib
import copy
import functools
import logging
import pydoc
import types
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule

from project.errors import UserError


@contextlib.contextmanager
def _quiet_pytree_log() -> Iterator[None]:
    # Importing torchao makes torch log "Calling register_constant() on Enum subclasses is deprecated"
    # (torch/utils/_pytree.py): torchao's business, not the user's.
    logger = logging.getLogger("torch.utils._pytree")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@functools.cache
def torchao_api() -> types.SimpleNamespace:
    """torchao's PT2E entry points, imported on first use (torchao is needed only for quantization)."""
    try:
        with _quiet_pytree_log():
            from torchao.quantization import pt2e as ao_pt2e
            from torchao.quantization.pt2e import quantize_pt2e
            from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError as e:
        raise UserError(f"quantization needs torchao ({e}); install it with: pip install torchao") from None
    return types.SimpleNamespace(
        prepare_qat_pt2e=quantize_pt2e.prepare_qat_pt2e,
        convert_pt2e=quantize_pt2e.convert_pt2e,
        X86InductorQuantizer=x86.X86InductorQuantizer,
        get_default_x86_inductor_quantization_config=x86.get_default_x86_inductor_quantization_config,
        disable_fake_quant=ao_pt2e.disable_fake_quant,
        disable_observer=ao_pt2e.disable_observer,
        enable_observer=ao_pt2e.enable_observer,
    )


@contextlib.contextmanager
def _only_present_conv_bn_patterns(graph: GraphModule) -> Iterator[None]:
    """Skips torchao's conv+BN fuse/fold passes for conv kinds and devices the graph does not contain.

    Each pass exports its search patterns with `torch.export` (about a second each) for conv1d, conv2d and
    both transposed convs, on CPU and, when CUDA is available, on CUDA too: 96-192 exports when converting a
    ResNet. Only the graph's own conv kind and device can match, so the others are skipped.
    """
    from torchao.quantization.pt2e import qat_utils

    devices = {t.device.type for t in [*graph.parameters(), *graph.buffers()]}
    # "aten.conv2d.default" -> "conv2d", the name of the F.conv2d the passes are called with
    present = {str(n.target).split(".")[1] for n in graph.graph.nodes if str(n.target).startswith("aten.")}
    originals = {
        name: getattr(qat_utils, name, None)
        for name in ("_fuse_conv_bn_qat_helper", "_fold_conv_bn_qat_helper")
    }

    def restricted(helper: Any) -> Any:
        def run(m: GraphModule, conv_fn: Any, example_inputs: Any, is_cuda: bool) -> GraphModule:
            if (
                getattr(conv_fn, "__name__", "") not in present
                or ("cuda" if is_cuda else "cpu") not in devices
            ):
                return m
            return helper(m, conv_fn, example_inputs, is_cuda=is_cuda)

        return run

    try:
        for name, helper in originals.items():
            if helper is not None:
                setattr(qat_utils, name, restricted(helper))
        yield
    finally:
        for name, helper in originals.items():
            if helper is not None:
                setattr(qat_utils, name, helper)


def capture(net: nn.Module, example: Tensor) -> GraphModule:
    """`torch.export` the network in its current mode, with a dynamic batch dimension.

    Without the dynamic dimension the graph is specialised to the example's batch size.
    """
    batch = torch.export.Dim("batch", min=1)
    try:
        graph = torch.export.export(net, (example,), dynamic_shapes=({0: batch},)).module()
    except Exception as e:
        raise UserError(
            f"could not capture {type(net).__name__} with torch.export for INT8 quantization: {e}"
        ) from e
    _split_reused_modules(graph)
    return graph


def _split_reused_modules(graph: GraphModule) -> None:
    """Give each call of a module used more than once (torchvision's BasicBlock calls `self.relu` twice) its own
    source partition.

    The quantizer groups nodes by the module they came from, and a ReLU module called twice yields a partition
    with two outputs, which `X86InductorQuantizer` rejects ("Input partition has more than one output node").
    Only single-op modules are split (all calls are the same ATen op), where one call is one node.
    """
    groups: dict[tuple[str, Any], list[torch.fx.Node]] = defaultdict(list)
    for node in graph.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if node.op == "call_function" and stack and "source_fn_stack" not in node.meta:
            groups[list(stack.values())[-1]].append(node)
    for (name, kind), nodes in groups.items():
        if len(nodes) < 2 or len({n.target for n in nodes}) != 1:
            continue
        module_type = pydoc.locate(kind) if isinstance(kind, str) else kind  # export records the class's path
        if isinstance(module_type, type):
            for i, node in enumerate(nodes):
                node.meta["source_fn_stack"] = [(f"{name}@{i}", module_type)]


def _nudge_zero_batchnorm_weights(net: nn.Module) -> int:
    """Makes exactly-zero BatchNorm scales (zero_init_residual) tiny instead; returns how many there were.

    QAT's conv+BN fold divides the convolution's output by gamma / sqrt(var + eps): an exactly-zero gamma turns
    the whole network's output into NaN. 1e-4 leaves the function practically unchanged.
    """
    count = 0
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.weight is not None:
                zero = module.weight == 0
                count += int(zero.sum())
                module.weight[zero] = 1e-4
    return count


def _x86_quantizer(ao: types.SimpleNamespace, is_qat: bool, reduce_range: bool = False) -> Any:
    """The x86 INT8 backend's quantizer: per-channel int8 weights, uint8 activations, fused conv patterns."""
    config = ao.get_default_x86_inductor_quantization_config(is_qat=is_qat, reduce_range=reduce_range)
    return ao.X86InductorQuantizer().set_global(config)


def prepare_qat(net: nn.Module, example: Tensor, reduce_range: bool = False) -> GraphModule:
    """Capture `net` (in training mode) and insert fake quantization for the x86 INT8 backend.

    The returned graph module follows `.train()` / `.eval()` (dropout and BatchNorm switch modes) like an eager
    module, so Lightning's loops drive it unchanged. `reduce_range` uses 7-bit activations, for CPUs without
    VNNI instructions (pre-2019 x86), where 8-bit activations can overflow.
    """
    ao = torchao_api()
    for module in net.modules():
        if any(hasattr(module, f"{name}_mask") for name, _ in module.named_parameters(recurse=False)):
            raise UserError(
                f"{type(net).__name__} still carries pruning masks ({type(module).__name__}); make pruning "
                "permanent before quantization-aware training starts (ProgressivePruning does so when its "
                "schedule ends)"
            )
    _nudge_zero_batchnorm_weights(net)
    net.train()
    graph = capture(net, example)
    with _only_present_conv_bn_patterns(graph):
        prepared = ao.prepare_qat_pt2e(graph, _x86_quantizer(ao, is_qat=True, reduce_range=reduce_range))
    prepared._bn_frozen = prepared._observers_frozen = False
    # prepare_qat_pt2e forbids .train()/.eval() on the result; these switch the graph's ops instead.
    prepared.train = types.MethodType(_train, prepared)
    prepared.eval = types.MethodType(lambda self: self.train(False), prepared)
    prepared.train(True)
    return prepared


def _train(self: GraphModule, mode: bool = True) -> GraphModule:
    """`.train(mode)` for an exported graph: rewrites the `training` flags of its dropout and BatchNorm ops, and
    pauses the observers in eval mode (validation data must not move the quantization ranges)."""
    set_graph_mode(self, dropout_training=mode, batchnorm_training=mode and not self._bn_frozen)
    ao = torchao_api()
    self.apply(ao.enable_observer if mode and not self._observers_frozen else ao.disable_observer)
    self.training = mode
    for module in self.children():
        module.train(mode)
    return self


def set_graph_mode(graph: GraphModule, dropout_training: bool, batchnorm_training: bool) -> None:
    """Sets the `training` argument of every dropout and BatchNorm op in an exported graph.

    In an exported graph the mode is an argument of each op, not a module attribute. Batch norm in eval mode
    uses (and stops updating) the running statistics: that is how BN statistics are frozen during QAT.
    """
    changed = False
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target == torch.ops.aten.dropout.default and node.args[2] != dropout_training:
            node.args = (*node.args[:2], dropout_training, *node.args[3:])
            changed = True
        elif node.target == torch.ops.aten.batch_norm.default and node.args[5] != batchnorm_training:
            node.args = (*node.args[:5], batchnorm_training, *node.args[6:])
            changed = True
    if changed:
        graph.recompile()


def freeze_batchnorm(graph: GraphModule) -> None:
    """From now on BatchNorm uses its running statistics, in training too (the fold becomes exact)."""
    # torch annotates Module.__setattr__ for tensors and modules only; a plain flag is stored as is.
    graph._bn_frozen = True  # pyright: ignore[reportArgumentType]
    graph.train(graph.training)


def freeze_observers(graph: GraphModule) -> None:
    """Stops updating the quantization ranges (scales and zero points stay as observed so far)."""
    graph._observers_frozen = True  # pyright: ignore[reportArgumentType]  # as in freeze_batchnorm
    graph.apply(torchao_api().disable_observer)


def without_fake_quant(graph: GraphModule) -> GraphModule:
    """A copy of a prepared model that computes in float: same weights, fake quantization off."""
    ao = torchao_api()
    clone = copy.deepcopy(graph)  # a deep copy is a plain GraphModule: set its ops' mode explicitly
    set_graph_mode(clone, dropout_training=False, batchnorm_training=False)
    clone.apply(ao.disable_fake_quant)
    clone.apply(ao.disable_observer)
    return clone.eval()


def convert(prepared: GraphModule) -> GraphModule:
    """The INT8 model (on the CPU) of a prepared, trained model; `prepared` itself is left untouched."""
    model = copy.deepcopy(prepared).cpu().eval()  # a deep copy is a plain GraphModule: set its ops' mode
    set_graph_mode(model, dropout_training=False, batchnorm_training=False)
    with _quiet_pytree_log(), _only_present_conv_bn_patterns(model):
        model = torchao_api().convert_pt2e(model)
    _drop_unused_attributes(model)
    return model


def _drop_unused_attributes(graph: GraphModule) -> None:
    """Deletes the float weights that conversion replaced by INT8 copies (they would be saved: 4x the size)."""
    used = {node.target for node in graph.graph.nodes if node.op == "get_attr"}
    for name, _ in [*graph.named_parameters(), *graph.named_buffers()]:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(graph.get_submodule(owner) if owner else graph, attr)
    graph.delete_all_unused_submodules()


def quantize_static(net: nn.Module, calibration_batches: Iterable[Tensor], example: Tensor) -> GraphModule:
    """Post-training static INT8 of an eval-mode float network: observers calibrated on the batches, then
    converted. `net` itself is left unchanged (the capture works on a copy of its graph)."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    ao = torchao_api()  # imports torchao quietly, with a clear error if it is missing
    prepared = prepare_pt2e(capture(net.eval(), example), _x86_quantizer(ao, is_qat=False))
    with torch.no_grad():
        for batch in calibration_batches:
            prepared(batch)
    return convert(prepared)
