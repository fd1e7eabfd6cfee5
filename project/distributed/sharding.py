"""FSDP2: `fully_shard` applied block by block, then to the whole network.

FSDP2 all-gathers one sharded unit's parameters just before that unit runs and frees them right after, so
peak memory is the sharded model plus one unit at a time. The unit is the residual block: big enough to keep
communication efficient, small enough that the gathered copy stays small. Sharding the whole network as one
unit would gather every parameter at once (no memory saved); sharding every layer would flood the network
with tiny collectives.
"""

from collections.abc import Callable, Iterable, Sequence

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel, fully_shard
from torchvision.models.convnext import CNBlock
from torchvision.models.efficientnet import FusedMBConv, MBConv
from torchvision.models.mobilenetv2 import InvertedResidual as InvertedResidualV2
from torchvision.models.mobilenetv3 import InvertedResidual as InvertedResidualV3
from torchvision.models.regnet import ResBottleneckBlock
from torchvision.models.resnet import BasicBlock, Bottleneck
from torchvision.models.swin_transformer import SwinTransformerBlock, SwinTransformerBlockV2
from torchvision.models.vision_transformer import EncoderBlock

from project.errors import UserError

#: The residual blocks of the template's and torchvision's networks: each becomes one FSDP2 unit.
BLOCK_TYPES: tuple[type[nn.Module], ...] = (
    BasicBlock,
    Bottleneck,
    CNBlock,
    EncoderBlock,
    SwinTransformerBlock,
    SwinTransformerBlockV2,
    MBConv,
    FusedMBConv,
    InvertedResidualV2,
    InvertedResidualV3,
    ResBottleneckBlock,
)


def sharding_units(net: nn.Module, block_types: Sequence[type[nn.Module]] = BLOCK_TYPES) -> list[nn.Module]:
    """The modules to shard one by one, outermost first.

    A network can name its own units with a `sharding_units()` method. Otherwise every module of one of
    `block_types` is a unit (blocks nested inside a unit are not split further); a network without such
    blocks (SimpleCNN, MLP) is sharded by its top-level children that hold parameters.
    """
    custom: Callable[[], Iterable[nn.Module]] | None = getattr(net, "sharding_units", None)
    if callable(custom):
        return list(custom())
    units: list[nn.Module] = []
    inside: set[int] = set()
    for module in net.modules():
        if id(module) in inside or module is net:
            continue
        if isinstance(module, tuple(block_types)):
            units.append(module)
            inside.update(id(m) for m in module.modules())
    if units:
        return units
    return [child for child in net.children() if any(p.requires_grad for p in child.parameters())]


def shard_network(net: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool = True) -> nn.Module:
    """`fully_shard` every unit of `net` (see `sharding_units`), then `net` itself, over `mesh`.

    `reshard_after_forward=True` frees each unit's gathered parameters after its forward and gathers them
    again for backward (ZeRO-3: least memory); `False` keeps them until backward (ZeRO-2-like: less
    communication, more memory). The root always keeps them: its backward starts right after the forward.
    Calling it on an already sharded network does nothing (Lightning calls `configure_model` once per
    `fit`/`validate`/`test`).
    """
    if isinstance(net, FSDPModule):
        return net
    for param in net.parameters():
        # fully_shard refuses non-contiguous parameters: channels-last (NHWC) conv weights go back to the
        # default layout (the inputs may stay NHWC; the convolution handles the mix).
        param.data = param.data.contiguous()
    for unit in sharding_units(net):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(net, mesh=mesh, reshard_after_forward=False)
    return net


def shard_for_device_mesh(net: nn.Module, mesh: DeviceMesh | None, strategy: object) -> None:
    """`LightningModule.configure_model` under FSDP2: shard `net` over the data-parallel dimension of the mesh
    ModelParallelStrategy sets (configs/trainer/fsdp2*.yaml); without a mesh (any other strategy), nothing."""
    if mesh is None:
        return
    names = mesh.mesh_dim_names or ()
    if "tensor_parallel" in names and mesh["tensor_parallel"].size() > 1:
        raise UserError(
            "ImageClassifier shards data-parallel only (FSDP2); got tensor_parallel_size="
            f"{mesh['tensor_parallel'].size()}. Use strategy project.distributed.FSDP2Strategy, or "
            "ModelParallelStrategy with tensor_parallel_size: 1."
        )
    dp_mesh = mesh["data_parallel"] if "data_parallel" in names else mesh
    shard_network(net, dp_mesh, getattr(strategy, "reshard_after_forward", True))


def clip_fsdp_grad_norm(model: nn.Module, value: float | None, algorithm: str | None) -> bool:
    """Norm clipping under FSDP (v1), where Lightning's FSDPStrategy refuses it: torch.nn.utils.clip_grad_norm_
    would see only this rank's shard, FSDP's own clip_grad_norm_ reduces the norm over all shards first.
    Returns whether it clipped (False: not FSDP v1, or no norm clipping asked for)."""
    if value and algorithm == "norm" and isinstance(model, FullyShardedDataParallel):
        model.clip_grad_norm_(value)
        return True
    return False
