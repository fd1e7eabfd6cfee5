"""The task seam's contract: every registered task, paired with an example source of a kind it accepts
(tests/contracts/test_sources.py's SOURCES), agrees with `check_task_fits_data` on every kind, trains a few steps in
a Lightning Trainer, reloads from its checkpoint with `weights_only=True` into a fresh task that answers the same,
writes one prediction row per image with its own columns, and, run through `fit` as users run it (its
`example_config`), stopped after a step and continued with `--ckpt_path last`, ends with the very weights of the run
never stopped.

A new task joins by registering (its package's REGISTER: project.registry); `python -m pytest tests/contracts` then
checks it."""

import csv
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from project.callbacks.prediction_writer import PredictionWriter
from project.cli import main
from project.data import ImageDataModule
from project.errors import UserError
from project.models import MLP
from project.registry import load_all
from project.tasks.task import ImageTask, check_task_fits_data, init_arguments
from tests.conftest import CONFIGS, PACKAGE, ROOT
from tests.contracts.test_sources import SOURCES, Source


@dataclass(frozen=True)
class Task:
    """A registered task and the example source it trains on: one of a kind it accepts, the one its
    `example_config` trains on where there is one."""

    task: type[ImageTask]

    @property
    def id(self) -> str:
        return self.task.__name__

    @property
    def data(self) -> Source:
        accepted = [s for s in SOURCES if issubclass(s.kind, self.task.accepts)]
        if not accepted:
            pytest.skip(f"no source of this copy gives {self.task.accepts[0].described}")
        return next((s for s in accepted if s.config == self.task.example_config), accepted[0])


#: Every registered task.
TASKS = [Task(task) for task in load_all("tasks").values()]


@pytest.fixture(params=TASKS, ids=lambda t: t.id)
def case(request) -> Task:
    return request.param


def written(case: Task, root: Path) -> ImageDataModule:
    data = case.data.build(root)
    case.data.write(root)
    return data


def build_task(case: Task, data: ImageDataModule, seed: int = 0) -> ImageTask:
    """The task as `fit` builds it: a tiny network, and the data's names, outputs and input shape linked in
    where the task takes them."""
    torch.manual_seed(seed)
    net = MLP(num_classes=data.num_classes, input_shape=data.input_shape, hidden=8)
    linked = {
        "num_classes": data.num_classes,
        "class_names": data.class_names,
        "input_shape": data.input_shape,
    }
    takes = init_arguments(case.task)
    return case.task(net=net, **{k: v for k, v in linked.items() if k in takes})


def test_accepts_the_kinds_it_says_and_refuses_the_others(case, tmp_path):
    data = written(case, tmp_path / "data")
    task = build_task(case, data)
    assert isinstance(data.targets, case.task.accepts)
    check_task_fits_data(task, data)  # its own data: no error
    assert task.network_outputs == data.num_classes  # what the data links into the network
    # Where the kind's metric picks the best checkpoint, the kind says its direction too.
    if task.monitor == f"val/{data.targets.metric}":
        assert task.monitor_mode == data.targets.mode
    for kind in load_all("target_kinds").values():
        other = SimpleNamespace(targets=kind(("x", "y")))  # a source of that kind
        if issubclass(kind, case.task.accepts):
            check_task_fits_data(task, other)
        else:
            with pytest.raises(UserError, match=f"gives {kind.described} but model {case.id} takes"):
                check_task_fits_data(task, other)


def trainer(root: Path, **settings) -> L.Trainer:
    common = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(default_root_dir=root, **common, **settings)


def eval_outputs(task: ImageTask, x: torch.Tensor) -> torch.Tensor:
    task.eval()
    with torch.no_grad():
        return task.probabilities(task(x))  # what the outputs stand for (a regressor's buffers too)


def test_trains_reloads_from_its_checkpoint_and_predicts(case, tmp_path):
    data = written(case, tmp_path / "data")
    task = build_task(case, data)
    before = {k: v.clone() for k, v in task.state_dict().items()}
    fit = trainer(tmp_path / "fit", max_epochs=1, limit_train_batches=3, limit_val_batches=2,
                  enable_checkpointing=True, num_sanity_val_steps=0)  # fmt: skip
    fit.fit(task, datamodule=data)
    assert fit.global_step == 3
    assert task.monitor in fit.callback_metrics  # what the checkpoint callback ranks by was logged
    changed = [k for k, v in task.state_dict().items() if not torch.equal(before[k], v)]
    assert changed, "training changed nothing"
    (ckpt,) = (tmp_path / "fit").rglob("*.ckpt")

    checkpoint = torch.load(ckpt, weights_only=True)  # plain types only: loads without running any code
    assert checkpoint["task"] == task.output_spec()
    assert checkpoint["data_identity"]["kind"] == data.targets.kind
    fresh = build_task(case, data, seed=1)
    x = data.transform_batch(next(iter(data.val_dataloader())), train=False)[0]
    assert not torch.equal(eval_outputs(fresh, x), eval_outputs(task, x))
    loaded = case.task.load_from_checkpoint(ckpt, net=fresh.net, weights_only=True)
    assert torch.equal(eval_outputs(loaded, x), eval_outputs(task, x))
    assert loaded.class_names == data.class_names and loaded.output_spec() == task.output_spec()

    out = tmp_path / "predictions.csv"
    predict = trainer(tmp_path / "predict", callbacks=[PredictionWriter(str(out))])
    predicted = predict.predict(loaded, datamodule=data)
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["input", *loaded.prediction_columns()]
    count = len(data.predict_set)  # pyright: ignore[reportArgumentType]
    assert len(rows) - 1 == count and all(len(row) == len(rows[0]) for row in rows)
    assert sorted(int(i) for p in predicted for i in p["index"]) == list(range(count))  # every image once
    # part: production
    from project.export.decoding import decoder_for

    # export, predict_onnx and serve read the checkpoint's record: they write the columns predict wrote
    assert decoder_for(checkpoint["task"], data.class_names).csv_header() == rows[0][1:]
    # /part: production


# -- stopped and continued, through `fit` -------------------------------------------------------------------
STOP_AT = 3  # the third step of the first epoch


class TermAfterStep(Callback):
    """SIGTERM to this process after training step `step` of a run that did not resume (as preemption sends)."""

    def __init__(self, step: int = STOP_AT) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.ckpt_path is None and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def fit_args(case: Task, data: Path, root: Path, *extra: str) -> list[str]:
    """`fit` with the task's shipped config (its scheduler, crop and flip: random draws every step), on the tiny
    data, with a tiny network."""
    if not case.task.example_config or case.data.config != case.task.example_config:
        pytest.skip(f"no example source for {case.task.example_config or 'a task without an example config'}")
    config = CONFIGS / Path(case.task.example_config).relative_to("configs")
    assert (ROOT / case.task.example_config).is_file(), case.task.example_config
    args = [
        "fit", "--config", config, *(flag.format(root=data) for flag in case.data.fit_flags),
        "--data.cache_dir", root / "cache", "--data.image_size", "8", "--data.batch_size", "4",
        "--data.num_workers", "0", "--model.net", f"{PACKAGE}.models.MLP", "--model.net.init_args.hidden", "8",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.max_epochs", "2",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.default_root_dir", root, "--test_after_fit", "false",
        *extra,
    ]  # fmt: skip
    return [str(a) for a in args]


def last_weights(root: Path) -> dict[str, torch.Tensor]:
    (last,) = root.glob("runs/version_*/checkpoints/last.ckpt")
    return torch.load(last, weights_only=True)["state_dict"]


def test_a_run_stopped_mid_epoch_and_continued_ends_bit_identical(case, tmp_path):
    data = tmp_path / "data"
    written(case, data)
    main(fit_args(case, data, tmp_path / "whole"))
    stop = ["--trainer.callbacks+=tests.contracts.test_tasks.TermAfterStep"]
    stopped = fit_args(case, data, tmp_path / "stopped", *stop)
    with pytest.raises(SystemExit) as ended:
        main(stopped)
    assert ended.value.code == 128 + signal.SIGTERM
    main([*stopped, "--ckpt_path", "last"])
    whole, resumed = last_weights(tmp_path / "whole"), last_weights(tmp_path / "stopped")
    assert resumed.keys() == whole.keys()
    different = [k for k in whole if not torch.equal(resumed[k], whole[k])]
    assert not different, f"the continued run ends with other weights: {different}"
