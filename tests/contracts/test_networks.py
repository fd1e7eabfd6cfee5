"""The network seam's contract: every network in NETWORKS, built as `fit` builds it (the data's `num_classes` and
`input_shape` linked in where its `__init__` takes them), gives one output per class, trains (every trainable
parameter gets a gradient), saves and loads (a fresh instance given the state dict answers the same), and exports
with `torch.export` at any batch size, as `export` writes it.

A new network is one entry in NETWORKS; `python -m pytest tests/contracts` then checks it."""

import contextlib
import inspect
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from project.models import MLP, AirbenchNet, CIFARResNet, SimpleCNN, TorchvisionNet

NUM_CLASSES = 5
#: Images per batch: 2, as `export` gives its example (one image would be specialised), and BatchNorm trains on.
BATCH = 2


@dataclass(frozen=True)
class Network:
    """A network class, the settings that keep it small (the rest are its defaults), and the input it is given."""

    id: str
    make: Callable[[], type[nn.Module]]  # the class; imported when called, for an optional part's network
    settings: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, int, int] = (3, 32, 32)


#: Every network the template ships. A new one is a line here.
NETWORKS = [
    Network("SimpleCNN", lambda: SimpleCNN, {"width": 4, "hidden": 16}),
    Network("SimpleCNN-48x40", lambda: SimpleCNN, {"width": 4, "hidden": 16}, (3, 48, 40)),
    Network("MLP", lambda: MLP, {"hidden": 16}, (3, 16, 12)),
    Network("CIFARResNet", lambda: CIFARResNet, {"depth": 18}, (3, 16, 16)),
    Network("AirbenchNet", lambda: AirbenchNet, {"widths": (8, 16, 16)}),
    Network("TorchvisionNet", lambda: TorchvisionNet, {"name": "resnet18"}),
    # part: pretrained
    Network("TimmNet", lambda: timm_net(), {"name": "test_resnet"}),
    # /part: pretrained
]


# part: pretrained
def timm_net() -> type[nn.Module]:
    pytest.importorskip("timm", reason="TimmNet needs timm: pip install -e '.[pretrained]'")
    from project.models.timm_net import TimmNet

    return TimmNet


# /part: pretrained


def build(network: Network, num_classes: int = NUM_CLASSES, seed: int = 0) -> nn.Module:
    """The network as `fit` builds it: `num_classes` and `input_shape` linked from the data where it takes them."""
    cls = network.make()
    takes = inspect.signature(cls).parameters
    linked = {"num_classes": num_classes, "input_shape": network.input_shape}
    torch.manual_seed(seed)
    return cls(**{k: v for k, v in linked.items() if k in takes}, **network.settings)


def images(network: Network, batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, *network.input_shape, generator=torch.Generator().manual_seed(seed))


def saved_and_loaded(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` through `torch.save` and a `torch.load(weights_only=True)`, as checkpoints are loaded."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_every_shipped_network_is_in_the_list():
    import project.models

    shipped = {getattr(project.models, name) for name in project.models.__all__}
    listed = set()
    for network in NETWORKS:
        # (an optional part's network without its extra installed is skipped, and not listed)
        with contextlib.suppress(pytest.skip.Exception):
            listed.add(network.make())
    missing = {cls.__name__ for cls in shipped if isinstance(cls, type) and issubclass(cls, nn.Module)} - {
        cls.__name__ for cls in listed
    }
    assert not missing, f"add {sorted(missing)} to NETWORKS"


@pytest.fixture(params=NETWORKS, ids=lambda n: n.id)
def network(request) -> Network:
    return request.param


def test_takes_num_classes_and_gives_one_output_per_class(network):
    assert "num_classes" in inspect.signature(network.make()).parameters  # what the data links in
    net = build(network)
    out = net(images(network, BATCH))
    assert out.shape == (BATCH, NUM_CLASSES), f"{tuple(out.shape)}: not (batch, num_classes)"
    assert out.dtype == torch.float32 and out.isfinite().all()


def test_backward_reaches_every_trainable_parameter(network):
    net = build(network).train()
    out = net(images(network, BATCH))
    (out * torch.randn_like(out)).sum().backward()
    trainable = {name: p for name, p in net.named_parameters() if p.requires_grad}
    assert trainable, "no trainable parameter"
    unreached = [name for name, p in trainable.items() if p.grad is None]
    assert not unreached, f"parameters the loss does not reach: {unreached[:5]}"
    assert all(p.grad.isfinite().all() for p in trainable.values())
    assert any(p.grad.abs().sum() > 0 for p in trainable.values())


def test_a_fresh_instance_given_the_state_dict_answers_the_same(network):
    net = build(network, seed=0)
    with torch.no_grad():  # the weights and the BatchNorm statistics moved away from the init
        net.train()
        for p in net.parameters():
            p.add_(0.01)
        net(images(network, BATCH, seed=2))
    fresh = build(network, seed=1)
    x = images(network, BATCH)
    fresh.eval()
    net.eval()
    with torch.no_grad():
        assert not torch.equal(fresh(x), net(x)), (
            "two seeds gave the same network: the check would prove nothing"
        )
        state = net.state_dict()
        fresh.load_state_dict(saved_and_loaded(state))  # as a checkpoint holds it
        assert torch.equal(fresh(x), net(x))
    assert fresh.state_dict().keys() == state.keys()


def test_exports_with_a_dynamic_batch(network):
    net = build(network).eval()
    batch = torch.export.Dim("batch", min=1, max=1 << 10)  # as `export` asks: any batch size
    with torch.no_grad():
        program = torch.export.export(net, (images(network, BATCH),), dynamic_shapes=({0: batch},))
        for size in (1, 3):  # one image (serving), and a batch of another size than the example
            x = images(network, size, seed=size)
            exported, eager = program.module()(x), net(x)
            assert exported.shape == (size, NUM_CLASSES)
            torch.testing.assert_close(exported, eager, rtol=1e-4, atol=1e-5)
