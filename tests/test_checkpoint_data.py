"""A checkpoint knows its data: a command that starts from one on data with other classes (renamed, added,
removed, re-ordered) is refused in one line naming the difference, and leaves the run as it was; fine-tuning onto
other classes is the explicit `--model.init_from`. Weight averaging (EMA) on one side of a resume only: said in
one line, and a fit without it continues from the trained weights, not the average."""

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging

from project.cli import main
from project.errors import UserError
from project.run.data_identity import check_same_names
from tests.callback_fit import make_data, make_model, make_trainer
from tests.conftest import CONFIGS, newest_run
from tests.fakes import make_image_folder


def folder_fit(images: Path, root: Path, *extra: object) -> list[str]:
    """A tiny `fit` of configs/folder.yaml (4 steps of a small CNN on 16-pixel images), its runs under `root`."""
    args = [
        "fit", "--config", CONFIGS / "folder.yaml", "--config", CONFIGS / "debug.yaml", "--model.net", "SimpleCNN",
        "--model.net.init_args.width", "4", "--model.net.init_args.hidden", "8",
        "--data.root", images, "--data.image_size", "16", "--data.batch_size", "8",
        "--data.cache_dir", root / "cache", "--trainer.default_root_dir", root / "logs", *extra,
    ]  # fmt: skip
    return [str(a) for a in args]


def run(args: list[str], capsys) -> tuple[int, list[str], str]:
    """(exit code, its `error:` lines, all it printed) of the CLI run of `args`."""
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    printed = capsys.readouterr()
    return (
        code,
        [line for line in printed.err.splitlines() if line.startswith("error:")],
        printed.out + printed.err,
    )


def trained_run(tmp_path: Path, capsys, *extra: object) -> tuple[Path, Path]:
    """(the image folder, the last.ckpt of one tiny fit on it)."""
    images = make_image_folder(tmp_path / "images", extras=False)
    code, errors, err = run(folder_fit(images, tmp_path, *extra), capsys)
    assert code == 0, err
    return images, newest_run(tmp_path / "logs") / "checkpoints" / "last.ckpt"


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under `folder` but the run folders' locks (taken by every command): its time and content."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".lock"]
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in files}


def rename_class(images: Path) -> str:
    (images / "c1").rename(images / "zebra")
    return "renamed c1 -> zebra"


def add_class(images: Path) -> str:
    shutil.copytree(images / "c0", images / "c3")
    return "added c3"


def remove_class(images: Path) -> str:
    shutil.rmtree(images / "c2")
    return "removed c2"


@pytest.mark.parametrize("change", [rename_class, add_class, remove_class])
@pytest.mark.slow
def test_resuming_onto_other_classes_is_refused_and_touches_nothing(change, tmp_path, capsys):
    images, ckpt = trained_run(tmp_path, capsys)
    difference = change(images)
    before = snapshot(tmp_path / "logs")
    resume = folder_fit(images, tmp_path, "--ckpt_path", "last", "--trainer.max_epochs", "2")
    code, errors, err = run(resume, capsys)
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(
        f"error: the checkpoint {ckpt} was trained on classes [c0, c1, c2]; the data now"
    )
    assert f": {difference}. Resume only onto the same classes" in errors[0]
    assert f"--model.init_from {ckpt}" in errors[0]
    assert snapshot(tmp_path / "logs") == before  # the run and its checkpoints as they were
    # The evaluations refuse it the same way, naming what to do instead.
    for command in ("validate", "test"):
        args = [command, *folder_fit(images, tmp_path, "--ckpt_path", ckpt)[1:]]
        code, errors, err = run(args, capsys)
        assert code == 1 and len(errors) == 1, err
        assert f": {difference}. Evaluate it on data with the same classes, in the same order" in errors[0]


@pytest.mark.slow
def test_a_checkpoint_of_reordered_classes_is_refused(tmp_path, capsys):
    # Folders are sorted by name, so their order cannot change alone; another source's order can (a CSV's).
    images, ckpt = trained_run(tmp_path, capsys)
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["data_identity"]["names"] = ["c1", "c0", "c2"]
    torch.save(checkpoint, ckpt)
    code, errors, err = run(folder_fit(images, tmp_path, "--ckpt_path", ckpt), capsys)
    assert code == 1 and len(errors) == 1, err
    assert (
        "trained on classes [c1, c0, c2]; the data now has [c0, c1, c2]: re-ordered (c0, c1 at other"
        in errors[0]
    )


@pytest.mark.slow
def test_resuming_onto_the_same_classes_continues(tmp_path, capsys):
    images, ckpt = trained_run(tmp_path, capsys)
    recorded = torch.load(ckpt, weights_only=True)
    assert recorded["data_identity"] == {
        "kind": "classes",
        "names": ["c0", "c1", "c2"],
        "source": "ImageFolderDataModule",
    }
    code, errors, err = run(
        folder_fit(images, tmp_path, "--ckpt_path", "last", "--trainer.max_epochs", "2"), capsys
    )
    assert code == 0, err
    assert torch.load(ckpt, weights_only=True)["global_step"] > recorded["global_step"]


@pytest.mark.slow
def test_init_from_fine_tunes_onto_other_classes(tmp_path, capsys):
    images, ckpt = trained_run(tmp_path, capsys)
    rename_class(images)
    add_class(images)
    frozen = ["--model.scheduler", "null", "--model.optimizer.init_args.lr", "0"]  # weights as loaded
    code, errors, err = run(folder_fit(images, tmp_path, "--model.init_from", ckpt, *frozen), capsys)
    assert code == 0, err
    assert f"model.init_from {ckpt}: " in err and "(the output layer starts new: the classes differ)" in err
    (new,) = [p for p in (tmp_path / "logs" / "runs").glob("version_*/checkpoints/last.ckpt") if p != ckpt]
    old, tuned = torch.load(ckpt, weights_only=True), torch.load(new, weights_only=True)
    assert tuned["data_identity"]["names"] == ["c0", "c2", "c3", "zebra"]
    weights = [k for k, v in old["state_dict"].items() if v.ndim > 1 and k in tuned["state_dict"]]
    head = [k for k in old["state_dict"] if old["state_dict"][k].shape != tuned["state_dict"][k].shape]
    assert head and all(k.startswith("net.classifier.") or ".fc" in k or "head" in k for k in head), head
    # Every weight but the output layer's came from the checkpoint.
    body = [k for k in weights if k not in head]
    assert body and all(torch.equal(old["state_dict"][k], tuned["state_dict"][k]) for k in body)


@pytest.mark.slow
def test_init_from_a_checkpoint_of_another_network_is_one_line(tmp_path, capsys):
    images, ckpt = trained_run(tmp_path, capsys)
    other = folder_fit(images, tmp_path, "--model.init_from", ckpt, "--model.net.init_args.width", "8")
    code, errors, err = run(other, capsys)
    assert code == 1 and len(errors) == 1, err
    assert errors[0].startswith(f"error: model.init_from {ckpt}: ") and "of another shape" in errors[0]


@pytest.mark.slow
def test_a_checkpoint_that_records_no_classes_still_resumes(tmp_path, capsys):
    images, ckpt = trained_run(tmp_path, capsys)
    checkpoint = torch.load(ckpt, weights_only=True)
    del checkpoint["data_identity"], checkpoint["task"]  # as written before checkpoints recorded them
    torch.save(checkpoint, ckpt)
    rename_class(images)  # nothing to compare the data with: resumed without a check
    code, errors, err = run(
        folder_fit(images, tmp_path, "--ckpt_path", "last", "--trainer.max_epochs", "2"), capsys
    )
    assert code == 0, err


def test_the_names_check_names_each_difference():
    with pytest.raises(UserError, match=r"renamed bird -> zebra\. Resume only onto the same classes"):
        check_same_names(("classes", ["ant", "bird", "cat"]), ["ant", "cat", "zebra"], "a.ckpt", fitting=True)
    with pytest.raises(
        UserError, match=r"trained on tags \[a, b\]; the data now has \[a, b, c\]: added c\. Ev"
    ):
        check_same_names(("tags", ["a", "b"]), ["a", "b", "c"], "a.ckpt", fitting=False)
    many = [f"class{i}" for i in range(100)]
    with pytest.raises(
        UserError, match=r"class11, \.\.\. \(100 in all\)\]; the data now has .* removed class99"
    ):
        check_same_names(("classes", many), many[:99], "a.ckpt", fitting=True)
    check_same_names(("classes", ["a", "b"]), ["a", "b"], "a.ckpt", fitting=True)
    check_same_names(None, ["a", "b"], "a.ckpt", fitting=True)


# -- weight averaging on one side of a resume ---------------------------------------------------------------
def test_a_fit_without_ema_continues_from_the_trained_weights_not_the_average(fake_cifar, tmp_path, capsys):
    first = tmp_path / "first"
    trainer = make_trainer(first, [EMAWeightAveraging(decay=0.9)], max_epochs=1, limit_train_batches=3)
    trainer.fit(make_model(), make_data(fake_cifar))
    ckpt = first / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    # Resumed without the average at the end of its training: the model holds what the checkpoint gave it.
    model = make_model()
    resumed = make_trainer(tmp_path / "second", [], max_epochs=1, limit_train_batches=3)
    resumed.fit(model, make_data(fake_cifar), ckpt_path=ckpt)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved["current_model_state"].items())
    assert not all(torch.equal(state[k], v) for k, v in saved["state_dict"].items())
    warnings_ = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("holds a weight average (EMA) beside the trained weights" in w for w in warnings_), warnings_


def test_an_ema_fit_from_a_checkpoint_without_average_says_so_in_one_line(fake_cifar, tmp_path, capsys):
    first = tmp_path / "first"
    make_trainer(first, [], max_epochs=1, limit_train_batches=2).fit(make_model(), make_data(fake_cifar))
    resumed = make_trainer(
        tmp_path / "second", [EMAWeightAveraging(decay=0.9)], max_epochs=2, limit_train_batches=2
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.fit(make_model(), make_data(fake_cifar), ckpt_path=first / "checkpoints" / "last.ckpt")
    assert not [w for w in caught if "not created with WeightAveraging" in str(w.message)]
    lines = [line for line in capsys.readouterr().err.splitlines() if "weight average" in line]
    assert (
        len(lines) == 1
        and lines[0].startswith("warning: the checkpoint ")
        and "holds no weight average" in lines[0]
    )


@pytest.mark.slow
def test_ema_on_one_side_of_a_resume_with_the_shipped_config_is_one_warning_line(tmp_path, capsys):
    ema = ["--config", str(CONFIGS / "callbacks" / "ema.yaml")]
    images, ckpt = trained_run(tmp_path, capsys, *ema)
    code, errors, printed = run(
        folder_fit(images, tmp_path, "--ckpt_path", ckpt, "--trainer.max_epochs", "2"), capsys
    )
    assert code == 0, printed
    lines = [line for line in printed.splitlines() if "weight average" in line or "WeightAveraging" in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"warning: the checkpoint {ckpt} holds a weight average"
    ), lines
    # And the other way: an EMA fit from the checkpoint of a fit without one.
    plain = newest_run(tmp_path / "logs") / "checkpoints" / "last.ckpt"
    again = folder_fit(images, tmp_path, *ema, "--ckpt_path", plain, "--trainer.max_epochs", "3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, errors, printed = run(again, capsys)
    assert code == 0, printed
    assert not [w for w in caught if "not created with WeightAveraging" in str(w.message)]
    lines = [line for line in printed.splitlines() if "weight average" in line or "WeightAveraging" in line]
    assert len(lines) == 1 and lines[0] == (
        f"warning: the checkpoint {plain} holds no weight average: the average (EMA) starts from its weights"
    )
