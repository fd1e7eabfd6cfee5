"""The reference airbench94 port (benchmarks/airbench_reference.py) and the template's AirbenchNet are the same
network: with the same weights they compute the same logits, so the two speed-run measurements compare recipes
and data, not architectures."""

import json

import torch

from benchmarks import airbench_reference as ref
from project.models import AirbenchNet


def copy_reference_weights(reference: torch.nn.Sequential, net: AirbenchNet) -> None:
    """The reference's Sequential (whiten, GELU, 3 groups, pool, flatten, head, scale) -> AirbenchNet's names."""
    ours = dict(net.named_parameters()) | dict(net.named_buffers())
    theirs = {"whiten": reference[0], "head": reference[7]}
    for g in range(3):
        group = reference[2 + g]
        # AirbenchNet's group: conv(0), pool(1), bn(2), gelu(3), conv(4), bn(5), gelu(6)
        for idx, module in ((0, group.conv1), (2, group.norm1), (4, group.conv2), (5, group.norm2)):
            theirs[f"layers.{1 + g}.{idx}"] = module
    for prefix, module in theirs.items():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            with torch.no_grad():
                ours[f"{prefix}.{name}"].copy_(tensor)


def test_reference_network_and_airbench_net_compute_the_same_logits():
    torch.manual_seed(0)
    reference, net = ref.make_net(10), AirbenchNet(num_classes=10)
    for module in reference.modules():  # non-trivial BatchNorm state, so a mismatch in the mapping shows
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
            module.bias.data.normal_()
    copy_reference_weights(reference, net)
    x = torch.randn(4, 3, 32, 32)
    reference.eval(), net.eval()
    torch.testing.assert_close(net(x), reference(x))
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert len(trainable) == sum(p.requires_grad for p in reference.parameters())  # the same frozen parts


def test_reference_trains_and_reports_tta_accuracy(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    images, labels = torch.rand(96, 3, 32, 32), torch.arange(96) % 3
    train = ref.Loader(images, labels, batch_size=32, aug=ref.HYP["aug"])
    test = ref.Loader(images[:40], labels[:40], batch_size=2000, train=False)
    acc = ref.train(train, test, num_classes=3, run=0, epochs=2)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["epoch"] for r in records if "epoch" in r] == [0, 1]
    assert records[-1]["tta_test_acc"] == round(acc, 4) and 0.0 <= acc <= 1.0
    assert train.epoch == 2  # the loader flips every image on odd epochs: it counts them
