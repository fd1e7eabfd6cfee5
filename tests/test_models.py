import pytest
import torch
from torch import nn

from project.models import MLP, CIFARResNet, SimpleCNN, TimmNet, TorchvisionNet, init_weights
from project.models.torchvision_net import _replace_head


@pytest.mark.parametrize(
    ("net", "shape"),
    [
        (SimpleCNN(num_classes=7), (3, 32, 32)),
        (SimpleCNN(num_classes=7), (3, 64, 48)),  # any input size
        (MLP(num_classes=7, input_shape=(3, 16, 16)), (3, 16, 16)),
        (CIFARResNet(num_classes=7, depth=18), (3, 32, 32)),
        (TorchvisionNet("resnet18", num_classes=7), (3, 64, 64)),
        (TorchvisionNet("mobilenet_v3_small", num_classes=7), (3, 64, 64)),
        (TimmNet("resnet18", num_classes=7), (3, 64, 64)),
        (TimmNet("vit_tiny_patch16_224", num_classes=7, model_kwargs={"img_size": 32}), (3, 32, 32)),
    ],
    ids=[
        "simplecnn",
        "simplecnn-any-size",
        "mlp",
        "cifar-resnet18",
        "tv-resnet18",
        "tv-mobilenet",
        "timm-resnet18",
        "timm-vit-32px",
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
