from functools import partial
from pathlib import Path
from urllib.error import URLError

import pytest
import torch
import torchvision
from torch import nn

from project.errors import UserError
from project.models import MLP, CIFARResNet, SimpleCNN, TorchvisionNet, init_weights
from project.models.torchvision_net import _replace_head
from project.tasks import ImageClassifier
from project.tasks.factories import build_optimizer


@pytest.mark.parametrize(
    ("net", "shape"),
    [
        (SimpleCNN(num_classes=7), (3, 32, 32)),
        (SimpleCNN(num_classes=7), (3, 64, 48)),  # any input size
        (MLP(num_classes=7, input_shape=(3, 16, 16)), (3, 16, 16)),
        (CIFARResNet(num_classes=7, depth=18), (3, 32, 32)),
        (TorchvisionNet("resnet18", num_classes=7), (3, 64, 64)),
        (TorchvisionNet("mobilenet_v3_small", num_classes=7), (3, 64, 64)),
    ],
    ids=[
        "simplecnn",
        "simplecnn-any-size",
        "mlp",
        "cifar-resnet18",
        "tv-resnet18",
        "tv-mobilenet",
    ],  # fmt: skip
)
def test_forward_backward(net: nn.Module, shape):
    x = torch.randn(4, *shape)
    out = net(x)
    assert out.shape == (4, 7)
    out.sum().backward()
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_cifar_resnet_keeps_resolution_in_stem():
    net = CIFARResNet(num_classes=10, depth=34)
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, nn.Identity)
    assert [len(layer) for layer in (net.layer1, net.layer2, net.layer3, net.layer4)] == [3, 4, 6, 3]
    # After the stem a 32x32 input is still 32x32 (the ImageNet stem would give 8x8).
    assert net.relu(net.bn1(net.conv1(torch.zeros(1, 3, 32, 32)))).shape[-1] == 32


def test_init_zeroes_last_bn_of_each_residual_block():
    net = CIFARResNet(num_classes=10)
    for block in [*net.layer1, *net.layer4]:
        assert torch.all(block.bn2.weight == 0)
        assert torch.all(block.bn1.weight == 1)
    init_weights(net, zero_init_residual=False)
    assert torch.all(net.layer1[0].bn2.weight == 1)


def test_torchvision_unknown_name_is_clear():
    with pytest.raises(ValueError, match="unknown model name 'resnet19'.*resnet18"):
        TorchvisionNet("resnet19")
    # A torchvision classifier whose head is no linear layer (SqueezeNet's is a convolution): said, not a bare
    # StopIteration.
    with pytest.raises(
        ValueError, match="SqueezeNet has no linear classifier .* choose a model that ends in one"
    ):
        TorchvisionNet("squeezenet1_0")


def test_replace_head_fits_num_classes():
    import torchvision

    net = torchvision.models.get_model("efficientnet_b0")  # 1000 classes, head inside a Sequential
    _replace_head(net, 5)
    assert net(torch.zeros(1, 3, 64, 64)).shape == (1, 5)


def test_simple_cnn_is_the_seed_articles_network():
    net = SimpleCNN(num_classes=10)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (3, 32, (3, 3), (1, 1), (1, 1)),
        (32, 64, (3, 3), (1, 1), (1, 1)),
    ]
    assert [(m.in_features, m.out_features) for m in linears] == [(4096, 256), (256, 10)]
    assert sum(p.numel() for p in net.parameters()) == 1_070_794
    # The 5x5 variant is a flag away, and keeps the output size.
    wide = SimpleCNN(num_classes=10, kernel_size=5)
    assert wide.features[0].kernel_size == (5, 5) and wide(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        SimpleCNN(kernel_size=4)


IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def test_torchvision_weights_come_from_the_hub_cache(tmp_path, monkeypatch):
    # torchvision reads $TORCH_HOME/hub/checkpoints/<the URL's file name> when it is there (the hash in the
    # name is checked only on download): the file a user with a network would have after the first run.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    cached = tmp_path / "hub" / "checkpoints" / Path(weights.url).name
    cached.parent.mkdir(parents=True)
    torch.manual_seed(1)
    saved = torchvision.models.resnet18().state_dict()
    torch.save(saved, cached)
    torch.manual_seed(2)
    net = TorchvisionNet("resnet18", num_classes=3, weights="IMAGENET1K_V1")
    loaded = net.net.state_dict()
    assert all(torch.equal(loaded[k], saved[k]) for k in saved if not k.startswith("fc."))
    assert loaded["fc.weight"].shape == (3, 512)
    assert net.input_stats() == IMAGENET
    assert TorchvisionNet("resnet18", num_classes=3).input_stats() is None
    with pytest.raises(ValueError, match="resnet18 has no weights 'IMAGENET1K_V9'.*IMAGENET1K_V1"):
        TorchvisionNet("resnet18", weights="IMAGENET1K_V9")


def test_torchvision_weights_that_cannot_be_downloaded_are_one_line_naming_the_offline_routes(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty cache: the weights must be downloaded

    def no_network(url, *args, **kwargs):
        raise URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", no_network)
    with pytest.raises(UserError) as refused:
        TorchvisionNet("resnet18", num_classes=3, weights="DEFAULT")
    assert str(refused.value) == (
        "model.net TorchvisionNet: could not download the pretrained weights of 'resnet18' (URLError: <urlopen "
        "error [Errno -2] Name or service not known>). Without a network, download them once where there is one "
        "and give the file with --model.net.init_args.weights_file PATH (a .safetensors or .pth state dict), or "
        "train from scratch with --model.net.init_args.weights null"
    )


def lrs_by_param(optimizer: torch.optim.Optimizer) -> dict[int, tuple[float, float]]:
    return {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}


def backbone_learns_slower_than_the_new_head(model: torch.nn.Module) -> None:
    task = ImageClassifier(model, num_classes=3)
    adamw = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05)
    lrs = lrs_by_param(build_optimizer(adamw, task, backbone_lr_scale=0.1))
    head = set(model.head_parameter_names())
    for name, p in model.named_parameters():
        lr, wd = lrs[id(p)]
        assert lr == pytest.approx(1e-3 if name in head else 1e-4), name
        # Weight decay itself unchanged (decoupled: it shrinks with the rate); biases and norms still exempt.
        assert wd == (0.0 if p.ndim == 1 else 0.05), name
    # Without the setting: the groups the template always made.
    assert len(build_optimizer(adamw, task).param_groups) == 2


def test_backbone_lr_scale_needs_a_network_that_names_its_head():
    task = ImageClassifier(SimpleCNN(num_classes=3, width=4, hidden=8), num_classes=3)
    with pytest.raises(
        UserError, match=r"model.backbone_lr_scale needs a network that says which parameters"
    ):
        build_optimizer(torch.optim.AdamW, task, backbone_lr_scale=0.1)
    tv = ImageClassifier(TorchvisionNet("resnet18", num_classes=3), num_classes=3)
    with pytest.raises(UserError, match=r"model.layer_decay needs a network that gives its layers' depths"):
        build_optimizer(torch.optim.AdamW, tv, layer_decay=0.7)


def test_torchvision_loads_a_weights_file_and_refuses_one_of_another_network(tmp_path, capsys):
    torch.manual_seed(1)
    saved = torchvision.models.resnet18().state_dict()
    torch.save({f"module.{k}": v for k, v in saved.items()}, tmp_path / "resnet18.pth")  # as DDP saves it
    torch.manual_seed(2)
    net = TorchvisionNet("resnet18", num_classes=3, weights_file=str(tmp_path / "resnet18.pth"))
    loaded = net.net.state_dict()
    assert all(torch.equal(loaded[k], saved[k]) for k in saved if not k.startswith("fc."))
    assert loaded["fc.weight"].shape == (3, 512) and net.input_stats() == IMAGENET
    owner = "model.net TorchvisionNet: weights_file"
    torch.save(torchvision.models.resnet34().state_dict(), tmp_path / "resnet34.pth")
    with pytest.raises(
        UserError, match=rf"{owner} .*resnet34.pth does not match the network: .* but not the net"
    ):
        TorchvisionNet("resnet18", weights_file=str(tmp_path / "resnet34.pth"))
    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), tmp_path / "mobilenet.pth")
    with pytest.raises(
        UserError, match=rf"{owner} .*mobilenet.pth matches none of the network's 100 tensors"
    ):
        TorchvisionNet("resnet18", weights_file=str(tmp_path / "mobilenet.pth"))
    torch.save({**saved, "conv1.weight": torch.zeros(32, 3, 7, 7)}, tmp_path / "narrow.pth")
    with pytest.raises(
        UserError,
        match=rf"{owner} .*narrow.pth does not fit the network: 1 tensor\(s\) of other shapes \(conv1.weight \(32, 3",
    ):
        TorchvisionNet("resnet18", weights_file=str(tmp_path / "narrow.pth"))
    torch.save(torchvision.models.resnet18(), tmp_path / "whole.pth")
    with pytest.raises(
        UserError, match=rf"{owner} .*whole.pth holds pickled Python objects \(torchvision.models"
    ):
        TorchvisionNet("resnet18", weights_file=str(tmp_path / "whole.pth"))


def test_torchvision_backbone_learns_slower_than_the_new_head():
    backbone_learns_slower_than_the_new_head(TorchvisionNet("resnet18", num_classes=3))
