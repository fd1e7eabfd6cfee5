"""Bad input through `python -m project`: exit code 1 or 2, one `error:` line naming what is at fault, no
traceback, nothing written. Most cases call `project.cli.main` in-process (the code path of `python -m
project`); those where the process boundary matters (a crafted pickle, W&B without network) run it for real.
"""

import io
import os
import socket
from pathlib import Path

import lightning
import numpy as np
import pytest
import torch
from PIL import Image

from project.cli import main
from project.data import ImageFolderDataModule
from project.errors import UserError
from project.models import MLP
from project.tasks import ImageClassifier
from tests.conftest import CONFIGS, run_cli
from tests.wandb_reader import read_run


def cifar_args(data: Path, root: Path, *extra) -> list[str]:
    return [
        "--config", str(CONFIGS / "cifar10.yaml"), "--config", str(CONFIGS / "debug.yaml"),
        "--model.net", "project.models.SimpleCNN", "--data.data_dir", str(data), "--data.download", "false",
        "--data.val_size", "100", "--data.batch_size", "50", "--trainer.default_root_dir", str(root),
        *map(str, extra),
    ]  # fmt: skip


def fails(args: list, capsys) -> str:
    """Run the CLI, expect a clean failure, return its one error line."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    assert exit_info.value.code in (1, 2)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert not [line for line in err.splitlines() if line.startswith("  [--")], "the full usage was printed"
    return errors[0]


# -- config -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model.nott_a_key", "1"], "nott_a_key"),
        (["--trainer.max_epochs", "many"], "max_epochs"),
        (
            ["--model.optimizer", "SGD", "--model.optimizer.init_args.lr", "-0.1"],
            "model.optimizer SGD: Invalid learning rate: -0.1",
        ),
        (
            ["--model.optimizer", "AdamW", "--model.optimizer.init_args.betas", "[0.9, 1.5]"],
            "model.optimizer AdamW",
        ),
        (["--data.batch_size", "0"], "data.batch_size must be at least 1, got 0"),
        (["--data.val_size", "600"], "data.val_size=600 is not smaller than the 500 training images"),
        (
            ["--trainer.accumulate_grad_batches", "0"],
            "trainer.accumulate_grad_batches must be at least 1, got 0",
        ),
        (["--model.label_smoothing", "1.5"], "ImageClassifier: label_smoothing must be in [0, 1), got 1.5"),
        (["--model.net", "NoSuchNet"], "NoSuchNet is not a network: one of AirbenchNet, CIFARResNet, MLP"),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "negative-lr",
        "bad-betas",
        "batch-size-0",
        "val-size-too-large",
        "accumulate-0",
        "label-smoothing",
        "unknown-net",
    ],  # fmt: skip
)
def test_bad_values_name_the_key(fake_cifar, tmp_path, capsys, extra, message):
    assert message in fails(["fit", *cifar_args(fake_cifar, tmp_path / "logs", *extra)], capsys)
    assert not (tmp_path / "logs").exists()  # stopped before anything was written


def test_unreadable_and_invalid_config_files_are_named(fake_cifar, tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("model:\n  net: [SimpleCNN\n")
    message = fails(["fit", *cifar_args(fake_cifar, tmp_path), "--config", tmp_path / "bad.yaml"], capsys)
    assert "config file" in message and "bad.yaml is not valid YAML (line 3" in message
    (tmp_path / "folder.yaml").mkdir()
    message = fails(["fit", "--config", tmp_path / "folder.yaml"], capsys)
    assert "cannot read config file" in message and "folder.yaml" in message
    message = fails(["fit", "--config", tmp_path / "missing.yaml"], capsys)
    assert "missing.yaml" in message
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    message = fails(["fit", *cifar_args(fake_cifar, tmp_path), "--config", tmp_path / "empty.yaml"], capsys)
    assert "config file" in message and "empty.yaml is empty" in message
    (tmp_path / "list.yaml").write_text("- trainer\n- model\n")
    message = fails(["fit", *cifar_args(fake_cifar, tmp_path), "--config", tmp_path / "list.yaml"], capsys)
    assert "list.yaml holds a list: a config is a mapping of settings" in message


# -- data -----------------------------------------------------------------------------------------------------
def test_missing_data_is_named(tmp_path, capsys):
    message = fails(["fit", *cifar_args(tmp_path / "no_cifar_here", tmp_path / "logs")], capsys)
    assert (
        "cifar10 is not in" in message and "no_cifar_here" in message and "cifar-10-python.tar.gz" in message
    )
    message = fails(["fit", "--config", CONFIGS / "folder.yaml", "--data.root", tmp_path / "nowhere"], capsys)
    assert "data.root" in message and "nowhere" in message


def save_images(folder: Path, n: int, size: tuple[int, int], mode: str = "RGB", ext: str = "png") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(folder)))
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).convert(mode).save(
            folder / f"{i}.{ext}"
        )


@pytest.mark.parametrize("cache", [True, False])
def test_empty_class_folder_and_broken_files_are_named(tmp_path, cache):
    root = tmp_path / "images"
    for c in ("a", "b"):
        save_images(root / c, 4, (40, 30))
    (root / "empty").mkdir()
    with pytest.raises(UserError, match=r"class folder .*empty contains no images"):
        _ = ImageFolderDataModule(
            str(root), image_size=32, cache=cache, cache_dir=str(tmp_path / "cache")
        ).class_names
    (root / "empty").rmdir()
    good = (root / "a" / "0.png").read_bytes()
    buffer = io.BytesIO()
    Image.new("RGB", (300, 300), "red").save(buffer, "JPEG")
    (root / "a" / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (root / "a" / "zero.png").write_bytes(b"")
    (root / "b" / "not_an_image.png").write_text("plain text with an image extension")
    (root / "b" / "notes.txt").write_text("other extensions are skipped")
    data = ImageFolderDataModule(
        str(root), image_size=32, cache=cache, cache_dir=str(tmp_path / "cache"), num_workers=0
    )
    if cache:  # the cache decodes every file once and names all the bad ones
        with pytest.raises(UserError) as error:
            data.setup("fit")
        for name in ("truncated.jpg", "zero.png", "not_an_image.png"):
            assert name in str(error.value)
        assert "notes.txt" not in str(error.value) and "data.skip_corrupt" in str(error.value)
    else:  # per-image decoding: the file is named when a worker reaches it
        data.setup("fit")
        ds = data.train_set
        bad = [
            i for i, f in enumerate(ds.files) if f.name in ("truncated.jpg", "zero.png", "not_an_image.png")
        ]
        for i in bad:
            with pytest.raises(UserError, match=f"cannot read image .*{ds.files[i].name}"):
                ds[i]
    skipping = ImageFolderDataModule(
        str(root),
        image_size=32,
        cache=cache,
        cache_dir=str(tmp_path / "cache"),
        skip_corrupt=True,
        num_workers=0,
    )
    skipping.setup("fit")
    kept = len(skipping.train_set) + len(skipping.val_set)
    # Left out with a warning: 8 good images remain. (Per-image decoding checks headers only, so a truncated
    # JPEG, whose header is intact, is still named when it is reached.)
    assert kept == (8 if cache else 9)
    assert (root / "a" / "0.png").read_bytes() == good  # nothing was modified


def test_tiny_and_unusual_mode_images_just_work(tmp_path):
    root = tmp_path / "images"
    save_images(root / "tiny", 3, (3, 2))  # far smaller than image_size and the crop
    save_images(root / "modes" / "rgba", 1, (40, 40), "RGBA")
    save_images(root / "modes" / "palette", 1, (40, 40), "P")
    save_images(root / "modes" / "gray", 1, (40, 40), "L", "jpg")
    save_images(root / "modes" / "cmyk", 1, (40, 40), "CMYK", "jpg")
    gradient = (np.arange(48 * 48).reshape(48, 48) * 28).astype(np.uint16)  # a 16-bit grayscale PNG
    Image.fromarray(gradient).save(root / "modes" / "gray16.png")
    data = ImageFolderDataModule(
        str(root), image_size=32, cache_dir=str(tmp_path / "cache"), num_workers=0, batch_size=4
    )
    data.setup("fit")
    images = torch.from_numpy(np.asarray(data.train_set.images))
    assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.uint8
    gray16 = images[[i for i, f in enumerate(data.train_files) if Path(f).name == "gray16.png"][0]].float()
    # 16-bit values are scaled, not clipped to white: the mean stays near the source's, in 8-bit units.
    assert abs(gray16.mean().item() - gradient.mean() / 257) < 8 and gray16.std() > 20
    x, y = data.transform_batch(next(iter(data.train_dataloader())), train=True)
    assert x.shape == (4, 3, 32, 32) and torch.isfinite(x).all()


# -- checkpoints and output --------------------------------------------------------------------------------------
def test_missing_and_foreign_checkpoints_are_named(fake_cifar, tmp_path, capsys):
    args = cifar_args(fake_cifar, tmp_path / "logs")
    message = fails(["validate", *args, "--ckpt_path", tmp_path / "nope.ckpt"], capsys)
    assert "nope.ckpt does not exist" in message
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "last.ckpt").write_bytes(b"")
    message = fails(["validate", *args, "--ckpt_path", tmp_path / "ckpts"], capsys)
    assert "ckpts is a folder: give a .ckpt file (in it: last.ckpt), or `last`/`best`" in message
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    message = fails(["fit", *args, "--ckpt_path", tmp_path / "notes.ckpt"], capsys)
    assert "notes.ckpt is not a PyTorch checkpoint" in message and "arbitrary code" not in message
    message = fails(["test", *args, "--ckpt_path", "last"], capsys)
    assert "--ckpt_path last: no run of these settings under" in message
    assert not (tmp_path / "logs").exists()


def test_checkpoint_of_another_network_lists_keys_and_shapes(fake_cifar, tmp_path, capsys):
    other = ImageClassifier(MLP(num_classes=10, hidden=32), num_classes=10)
    ckpt = tmp_path / "mlp.ckpt"
    torch.save({"state_dict": other.state_dict(), "pytorch-lightning_version": lightning.__version__}, ckpt)
    message = fails(["validate", *cifar_args(fake_cifar, tmp_path / "logs"), "--ckpt_path", ckpt], capsys)
    assert f"checkpoint {ckpt} does not fit the network (ImageClassifier)" in message
    assert (
        "missing from the checkpoint: net.features.0.weight" in message and "net.layers.1.weight" in message
    )
    narrow = ImageClassifier(MLP(num_classes=10, hidden=32), num_classes=10)
    torch.save({"state_dict": narrow.state_dict(), "pytorch-lightning_version": lightning.__version__}, ckpt)
    args = cifar_args(
        fake_cifar,
        tmp_path / "logs",
        "--model.net",
        "project.models.MLP",
        "--model.net.init_args.hidden",
        "64",
    )
    message = fails(["validate", *args, "--ckpt_path", ckpt], capsys)
    assert "net.layers.1.weight: (32, 3072) in the checkpoint, (64, 3072) in the network" in message


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.slow
def test_crafted_checkpoint_is_refused_by_the_cli(fake_cifar, tmp_path):
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.6", "payload": RunsCode()}, evil)
    proc = run_cli(
        "test", *cifar_args(fake_cifar, tmp_path / "logs"), "--ckpt_path", evil, cwd=tmp_path, check=False
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "refusing to load" in proc.stderr and "evil.ckpt" in proc.stderr
    assert not (tmp_path / "pwned").exists()


def test_unwritable_output_folder_is_named(fake_cifar, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    message = fails(["fit", *cifar_args(fake_cifar, tmp_path / "a_file" / "logs")], capsys)
    assert "trainer.default_root_dir" in message and "a_file/logs is not a writable folder" in message


def test_the_data_input_shape_reaches_networks_that_take_one(image_folder, tmp_path):
    """MLP's input layer is sized from the DataModule's input_shape (linked like num_classes), so a network
    that takes an input shape cannot be built for another one."""
    from project.cli import build

    args = ["--config", CONFIGS / "folder.yaml", "--data.root", image_folder, "--data.image_size", "16"]
    args += ["--data.cache_dir", tmp_path / "cache", "--model.net", "project.models.MLP"]
    cli = build([str(a) for a in args])
    assert cli.model.net.layers[1].in_features == 3 * 16 * 16


# -- training and logging ----------------------------------------------------------------------------------------
def test_nan_loss_stops_with_step_and_layer(fake_cifar, tmp_path, capsys):
    huge_lr = [
        "--model.optimizer",
        "SGD",
        "--model.optimizer.init_args.lr",
        "1e30",
        "--model.scheduler",
        "null",
    ]
    args = cifar_args(fake_cifar, tmp_path / "logs", *huge_lr, "--trainer.limit_train_batches", "8")
    message = fails(["fit", *args, "--trainer.max_epochs", "2"], capsys)
    assert (
        "training stopped at global step" in message
        and "first layer with a non-finite gradient: net." in message
    )
    assert not list(tmp_path.rglob("*.ckpt"))  # no checkpoint of the broken weights


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.slow
def test_online_wandb_without_network_trains_offline_with_a_warning(fake_cifar, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")  # common in ML shells: the notice must show all the same
    args = cifar_args(fake_cifar, tmp_path / "logs", "--config", CONFIGS / "logger" / "wandb_online.yaml")
    proc = run_cli("fit", *args, cwd=tmp_path, timeout=240)
    assert "W&B online logging is not possible: cannot reach http://127.0.0.1" in proc.stderr
    assert "wandb sync" in proc.stderr
    (run_dir,) = (tmp_path / "logs" / "wandb").glob("offline-run-*")
    assert any("val/acc" in row for row in read_run(run_dir)["history"])


@pytest.mark.parametrize(
    ("limit", "named"),
    [(["--trainer.max_steps", "3"], "--trainer.max_steps (3)"), ([], "--trainer.max_epochs (1)")],
    ids=["max_steps", "max_epochs"],
)
def test_continuing_a_finished_run_names_the_limit_that_ended_it(fake_cifar, tmp_path, capsys, limit, named):
    args = ["fit", *cifar_args(fake_cifar, tmp_path / "logs", "--trainer.limit_val_batches", "1", *limit)]
    main(args)
    main([*args, "--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert f"nothing was trained. To train longer, raise {named}" in err, err[-2000:]


@pytest.mark.slow
def test_predict_names_every_unreadable_image_or_leaves_them_all_out(tmp_path, capsys):
    for name in ("a", "b"):
        save_images(tmp_path / "images" / name, 6, (16, 16))
    args = ["--config", CONFIGS / "folder.yaml", "--data.root", tmp_path / "images", "--data.image_size", "16",
            "--data.cache_dir", tmp_path / "cache", "--model.net", "SimpleCNN", "--data.val_fraction", "0.34",
            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", tmp_path / "logs"]  # fmt: skip
    main([str(a) for a in ["fit", *args, "--trainer.max_steps", "1"]])
    unlabeled = tmp_path / "unlabeled"
    save_images(unlabeled, 2, (20, 12))
    (unlabeled / "empty.png").write_bytes(b"")
    (unlabeled / "half.png").write_bytes((unlabeled / "0.png").read_bytes()[:60])
    predict = ["predict", *args, "--ckpt_path", "best", "--data.predict_root", unlabeled]
    message = fails(predict, capsys)
    assert "unreadable image file(s)" in message and "empty.png" in message and "half.png" in message
    capsys.readouterr()
    main([str(a) for a in [*predict, "--data.skip_corrupt", "true"]])
    rows = (next((tmp_path / "logs").rglob("predictions.csv"))).read_text().splitlines()
    assert len(rows) == 1 + 2  # header and the two readable images
    assert "leaving out 2 unreadable image(s)" in capsys.readouterr().err
    main([str(a) for a in ["predict", *args, "--ckpt_path", "best"]])
    assert "warning: no data.predict_root given: predicting the validation split (" in capsys.readouterr().err
