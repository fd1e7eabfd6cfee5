"""Pretrained backbones: timm and torchvision weights loaded through the path a download takes (from a local
file: this machine cannot reach the hub), the mean/std they expect, and the optimizer's smaller learning rate
for the backbone than for the new head."""

import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torchvision

from project.cli import Run, build, main
from project.errors import UserError
from project.models import SimpleCNN
from project.models.timm_net import TimmNet
from project.tasks import ImageClassifier
from project.tasks.factories import build_optimizer, scaled_max_lr
from tests import docs_pages
from tests.conftest import CONFIGS, PACKAGE, ROOT, subprocess_env
from tests.test_models import IMAGENET, backbone_learns_slower_than_the_new_head, lrs_by_param
from tests.test_models import test_forward_backward as forward_backward
from tests.tiny_fit import command_args

TINY_TIMM = "test_resnet.r160_in1k"  # timm's own test model: a small ResNet, its weights' mean/std 0.5
TINY_TIMM_STATS = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
IMAGENET_TIMM = "test_efficientnet.r160_in1k"  # another, with ImageNet's mean/std


@pytest.mark.parametrize(
    ("net", "shape"),
    [
        (TimmNet("resnet18", num_classes=7), (3, 64, 64)),
        (TimmNet("vit_tiny_patch16_224", num_classes=7, model_kwargs={"img_size": 32}), (3, 32, 32)),
    ],
    ids=["timm-resnet18", "timm-vit-32px"],
)
def test_timm_networks_train(net, shape):
    forward_backward(net, shape)


def saved_timm_weights(path: Path, name: str = TINY_TIMM) -> dict[str, torch.Tensor]:
    """A randomly initialised ImageNet model's state dict, saved where a download would have put its file."""
    import timm

    torch.manual_seed(1)
    state = timm.create_model(name, pretrained=False).state_dict()
    torch.save(state, path)
    return state


def test_timm_loads_a_local_weights_file_through_the_pretrained_path(tmp_path):
    saved = saved_timm_weights(tmp_path / "weights.pth")
    torch.manual_seed(2)  # a different random init: only loading can make the weights equal
    net = TimmNet(TINY_TIMM, num_classes=5, weights_file=str(tmp_path / "weights.pth"))
    loaded = net.net.state_dict()
    backbone = [k for k in saved if not k.startswith("fc.")]
    assert all(torch.equal(loaded[k], saved[k]) for k in backbone)
    assert loaded["fc.weight"].shape == (5, saved["fc.weight"].shape[1])  # a fresh head for 5 classes
    assert net.input_stats() == TINY_TIMM_STATS  # timm's data config for these weights
    assert TimmNet("resnet18.a1_in1k", pretrained=False).input_stats() is None
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 5)
    assert set(net.head_parameter_names()) == {"net.fc.weight", "net.fc.bias"}


def test_timm_adapts_the_pretrained_first_conv_to_the_linked_channels(tmp_path):
    saved = saved_timm_weights(tmp_path / "weights.pth")
    net = TimmNet(
        TINY_TIMM, num_classes=3, input_shape=(1, 16, 16), weights_file=str(tmp_path / "weights.pth")
    )
    first = next(k for k in saved if saved[k].ndim == 4)  # the stem's conv: RGB summed into one channel
    assert torch.allclose(net.net.state_dict()[first], saved[first].sum(1, keepdim=True))
    assert net(torch.randn(2, 1, 16, 16)).shape == (2, 3)
    assert net.input_stats() == ((0.5,), (0.5,))  # one channel: the stats' channel average


def test_timm_from_scratch_has_no_stats_and_its_options_reach_the_model():
    net = TimmNet(TINY_TIMM, num_classes=4, drop_path_rate=0.1, drop_rate=0.2, grad_checkpointing=True)
    assert net.input_stats() is None  # the data's own statistics apply
    assert net.net.drop_rate == 0.2 and net.net.grad_checkpointing
    assert any(getattr(m, "drop_prob", 0) > 0 for m in net.modules())  # stochastic depth
    out = net.train()(torch.randn(2, 3, 32, 32))
    out.sum().backward()  # through the checkpointed blocks
    assert all(p.grad is not None for p in net.parameters())


def test_timm_bad_name_or_missing_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"unknown timm model name 'resnet_18'"):
        TimmNet("resnet_18")
    with pytest.raises(UserError, match=r"weights_file .*nothere.pth does not exist"):
        TimmNet(TINY_TIMM, weights_file=str(tmp_path / "nothere.pth"))


def test_timm_backbone_learns_slower_than_the_new_head():
    backbone_learns_slower_than_the_new_head(TimmNet(TINY_TIMM, num_classes=3))


def test_layer_decay_scales_each_timm_stage_below_the_next():
    model = TimmNet(TINY_TIMM, num_classes=3)
    sgd = partial(torch.optim.SGD, lr=1.0)
    optimizer = build_optimizer(sgd, ImageClassifier(model, num_classes=3), layer_decay=0.5)
    lrs = lrs_by_param(optimizer)
    depth = model.layer_ids()
    top = max(depth.values())
    for name, p in model.named_parameters():
        assert lrs[id(p)][0] == pytest.approx(0.5 ** (top - depth[name])), name
    assert lrs[id(model.net.fc.weight)][0] == 1.0 and top >= 3
    # A OneCycle schedule gets one max_lr per group, scaled alike (it would otherwise reset every group).
    schedule = partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=1.0, total_steps=10)
    max_lrs = scaled_max_lr(schedule, optimizer)
    assert max_lrs == [g.get("lr_scale", 1.0) for g in optimizer.param_groups]
    assert min(max_lrs) == pytest.approx(0.5**top)


@pytest.mark.slow
def test_timm_weights_that_cannot_be_downloaded_are_one_line_at_once(tmp_path):
    # An empty hub cache and a hub whose name does not resolve (.invalid never does): a machine offline.
    env = {**subprocess_env(), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "https://hub.invalid"}
    code = "from project.models.timm_net import TimmNet; TimmNet('resnet18.a1_in1k', pretrained=True)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        "project.errors.UserError: model.net TimmNet: could not download the pretrained weights of "
        "'resnet18.a1_in1k' (https://hub.invalid cannot be reached). Without a network, download them once "
        "where there is one and give the file with --model.net.init_args.weights_file PATH (a .safetensors or "
        ".pth state dict), or train from scratch with --model.net.init_args.pretrained false"
    ).replace("project.errors", f"{PACKAGE}.errors")


def test_timm_weights_in_the_hub_cache_load_without_the_network(tmp_path, monkeypatch):
    # The cache-only attempt comes first: weights a first run downloaded need no network after.
    import timm
    from huggingface_hub import constants

    calls = []

    def create_model(name, pretrained=False, **kwargs):
        calls.append((pretrained, constants.HF_HUB_OFFLINE))
        return real(name, pretrained=False, **kwargs)

    real, before = timm.create_model, constants.HF_HUB_OFFLINE
    monkeypatch.setattr(timm, "create_model", create_model)
    net = TimmNet(TINY_TIMM, num_classes=3, pretrained=True)
    assert calls == [(True, True)] and constants.HF_HUB_OFFLINE is before and net.pretrained


def test_timm_is_imported_only_by_a_run_that_uses_it():
    code = "import sys, project.cli, project.models; assert 'timm' not in sys.modules, 'timm imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)


def readme_or_config_commands() -> list[str]:
    """The `python -m project` lines of the README, the docs pages and the experiment presets' comments."""
    texts = [
        docs_pages.text(),
        *(p.read_text() for p in (CONFIGS / "experiment").glob("*.yaml")),
    ]
    lines = [line.lstrip("# ").split("  #")[0].strip() for text in texts for line in text.splitlines()]
    return sorted({line for line in lines if line.startswith("python -m project ")})


FINETUNE_COMMANDS = [c for c in readme_or_config_commands() if "photos_finetune.yaml" in c]


@pytest.mark.parametrize("command", FINETUNE_COMMANDS)
@pytest.mark.slow
def test_the_finetune_commands_train_from_the_weights_a_download_would_give(
    command, image_folder, tmp_path, monkeypatch
):
    # Each documented command at a test's scale, the weights where a download would have put them: timm's
    # file given directly (the hub cache is Hugging Face's), torchvision's in its hub cache.
    args = command_args(command.replace("path/to/images", str(image_folder)))
    if "TorchvisionNet" in command:
        monkeypatch.setenv("TORCH_HOME", str(tmp_path))
        weights = (
            tmp_path / "hub" / "checkpoints" / Path(torchvision.models.ResNet18_Weights.DEFAULT.url).name
        )
        weights.parent.mkdir(parents=True)
        torch.manual_seed(1)
        saved = torchvision.models.resnet18().state_dict()
        torch.save(saved, weights)
    else:
        weights = tmp_path / "resnet18.a1_in1k.pth"
        saved = saved_timm_weights(weights, "resnet18.a1_in1k")
        args += ["--model.net.init_args.weights_file", str(weights)]
    args += [
        "--data.image_size", "32", "--data.batch_size", "8", "--data.cache_dir", str(tmp_path / "cache"),
        "--data.skip_corrupt", "true",  # the fixture holds a broken file
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "runs"),
    ]  # fmt: skip
    main(args)
    (ckpt,) = (tmp_path / "runs").glob("runs/version_*/checkpoints/last.ckpt")
    # Two steps at OneCycle's starting rate move each weight by ~1e-4: still the file's, not a fresh init's.
    checkpoint = torch.load(ckpt, weights_only=True)
    trained = checkpoint["state_dict"]
    convs = [k for k, v in saved.items() if v.ndim == 4]
    assert max(float((trained[f"net.net.{k}"] - saved[k]).abs().max()) for k in convs) < 1e-2
    # The data was normalised as the weights expect (both are ImageNet's), and the checkpoint says so to
    # export and serve.
    assert checkpoint["ImageFolderDataModule"]["mean"] == pytest.approx(IMAGENET[0])
    assert checkpoint["ImageFolderDataModule"]["std"] == pytest.approx(IMAGENET[1])


def finetune_cli(image_folder: Path, tmp_path: Path, *extra: str, pretrained: bool = True) -> Run:
    weights = tmp_path / "weights.pth"
    saved_timm_weights(weights, IMAGENET_TIMM)
    args = [
        "--config", str(CONFIGS / "folder.yaml"), "--config", str(CONFIGS / "experiment" / "photos_finetune.yaml"),
        "--data.root", str(image_folder), "--data.skip_corrupt", "true", "--model.net.init_args.name", IMAGENET_TIMM,
        "--trainer.default_root_dir", str(tmp_path), *extra,
    ]  # fmt: skip
    pretrained_args = ["--model.net.init_args.weights_file", str(weights)]
    return build([*args, *(pretrained_args if pretrained else ["--model.net.init_args.pretrained", "false"])])


def test_the_data_uses_the_backbones_stats_unless_the_config_sets_its_own(image_folder, tmp_path):
    data = finetune_cli(image_folder, tmp_path).datamodule
    assert (data.mean, data.std) == IMAGENET
    given = ["--data.mean", "[0.1, 0.2, 0.3]", "--data.std", "[0.3, 0.2, 0.1]"]
    data = finetune_cli(image_folder, tmp_path, *given).datamodule
    assert (data.mean, data.std) == ((0.1, 0.2, 0.3), (0.3, 0.2, 0.1))
    scratch = finetune_cli(image_folder, tmp_path, pretrained=False)
    assert not scratch.datamodule._given_stats  # from scratch: measured on the training images, as before


def test_the_task_setting_gives_the_backbone_a_smaller_learning_rate():
    net = TimmNet(TINY_TIMM, num_classes=3)
    adamw = partial(torch.optim.AdamW, lr=1e-3)
    task = ImageClassifier(net, num_classes=3, optimizer=adamw, backbone_lr_scale=0.1, layer_decay=0.5)
    lrs = lrs_by_param(task.configure_optimizers())
    assert lrs[id(net.net.fc.weight)][0] == 1e-3
    assert lrs[id(net.net.conv1[0].weight)][0] == pytest.approx(1e-4 * 0.5 ** max(net.layer_ids().values()))
    with pytest.raises(UserError, match="model.backbone_lr_scale needs a network that says which parameters"):
        ImageClassifier(SimpleCNN(num_classes=3, width=4, hidden=8), num_classes=3, backbone_lr_scale=0.1)


# -- a weights_file that does not fit: one line, never a silent random initialisation -------------------------
def timm_file(path: Path, name: str = TINY_TIMM, drop: str = "", extra: bool = False) -> Path:
    """A timm model's state dict saved at `path`, without the keys starting with `drop`, or with a key more."""
    state = {k: v for k, v in saved_timm_weights(path, name).items() if not (drop and k.startswith(drop))}
    torch.save({**state, **({"extra_block.weight": torch.zeros(2)} if extra else {})}, path)
    return path


def refused(capsys, **kwargs) -> str:
    """The one-line message of the UserError that building TimmNet(**kwargs) raises."""
    with pytest.raises(UserError) as error:
        TimmNet(**{"name": TINY_TIMM, "num_classes": 3, **kwargs})
    message = str(error.value)
    assert "\n" not in message and len(message) < 600, message
    assert "Unexpected keys" not in capsys.readouterr().err  # timm's own list of every key is not printed
    return message


def test_a_weights_file_whose_keys_match_nothing_is_refused(tmp_path, capsys):
    path = tmp_path / "other.pth"
    torch.save({f"encoder.{k}": v for k, v in saved_timm_weights(path).items()}, path)
    message = refused(capsys, weights_file=str(path))
    assert message.startswith(f"model.net TimmNet: weights_file {path} matches none of the network's ")
    assert "its keys (encoder.conv1.0.weight, " in message


def test_a_weights_file_that_loads_in_part_is_refused_unless_allowed(tmp_path, capsys):
    lacking = timm_file(tmp_path / "lacking.pth", drop="layer4.")
    message = refused(capsys, weights_file=str(lacking))
    assert f"weights_file {lacking} does not match the network: " in message
    assert re.search(
        r": (\d+) of the network's (\d+) tensors \(the head apart\) matched; missing from the", message
    )
    assert "missing from the file: " in message and "(layer4." in message and "allow_partial: true" in message
    longer = timm_file(tmp_path / "longer.pth", extra=True)
    assert "in the file but not the network: 1 (extra_block.weight)" in refused(
        capsys, weights_file=str(longer)
    )
    # Allowed: the matching tensors load, one warning line says how many.
    net = TimmNet(TINY_TIMM, num_classes=3, weights_file=str(lacking), allow_partial=True)
    saved = torch.load(lacking, weights_only=True)
    assert all(torch.equal(net.net.state_dict()[k], v) for k, v in saved.items() if not k.startswith("fc."))
    warnings_ = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings_) == 1 and "loaded (allow_partial); missing from the file: " in warnings_[0]


def test_a_resnet34_file_is_refused_by_a_resnet18_in_one_line(tmp_path, capsys):
    path = timm_file(tmp_path / "resnet34.pth", name="resnet34")
    message = refused(capsys, name="resnet18", weights_file=str(path))
    assert "in the file but not the network: 96 (layer1.2.conv1.weight, layer1.2.bn1.weight, " in message


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            b"this is not a weights file",
            "is not a readable weights file (a .safetensors file or a torch.save'd",
        ),
        ("truncated", "is not a readable weights file"),
        (
            "whole model",
            "holds pickled Python objects (timm.models.resnet.ResNet), not only tensors: refused",
        ),
        ("other architecture", "does not fit the network: "),
    ],
)
def test_a_corrupt_pickled_or_foreign_weights_file_is_one_line_naming_it(content, says, tmp_path, capsys):
    import timm

    path = tmp_path / "weights.pth"
    if content == "truncated":
        path.write_bytes(timm_file(path).read_bytes()[:5000])
    elif content == "whole model":
        torch.save(timm.create_model(TINY_TIMM), path)
    elif content == "other architecture":
        timm_file(path, name=IMAGENET_TIMM)
    else:
        path.write_bytes(content)
    message = refused(capsys, weights_file=str(path))
    assert message.startswith(f"model.net TimmNet: weights_file {path} ") and says in message, message
    assert "weights_only=False" not in message


def test_the_finetune_command_with_a_weights_file_of_another_network_stops_in_one_line(
    image_folder, tmp_path, capsys
):
    path = tmp_path / "other.pth"
    torch.save({"classifier.weight": torch.zeros(3, 3)}, path)
    timm_command = next(c for c in FINETUNE_COMMANDS if "TorchvisionNet" not in c)
    args = command_args(timm_command.replace("path/to/images", str(image_folder)))
    args += ["--model.net.init_args.weights_file", str(path), "--trainer.default_root_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and f"weights_file {path} matches none of the network's " in errors[0]
