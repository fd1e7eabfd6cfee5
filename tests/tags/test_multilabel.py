"""Multi-label targets end to end: the task (loss, mAP, per-tag AP, thresholds chosen on validation, the checkpoint
record), its predictions, and what export, predict_onnx, serve, quantize's report, cv's evaluation and the W&B
dashboard make of them. Tiny tensors and a 2-tag identity "network" whose outputs are the inputs."""

import csv
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks import PredictionWriter
from project.data.targets import Classes
from project.errors import UserError
from project.models import MLP
from project.tags.kind import Tags
from project.tags.task import MultiLabelClassifier
from project.tasks import ImageClassifier
from project.tasks.task import check_task_fits_data

TAGS = ["cat", "dog"]


def logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


# Tag "cat": positives at 0.7, negatives at 0.2 -> the first threshold with F1 1 is 0.21.
# Tag "dog": positives at 0.9 and 0.4, negatives at 0.3 -> 0.31 keeps both positives, F1 1.
PROBS = torch.tensor([[0.7, 0.9], [0.7, 0.3], [0.2, 0.4], [0.2, 0.3]])
TARGETS = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
LOGITS = PROBS.log() - (1 - PROBS).log()


class TagData(L.LightningDataModule):
    """Outputs-as-inputs: the identity network's 'logits' are the inputs, with multi-hot targets."""

    targets = Tags(tuple(TAGS))
    class_names = TAGS
    predict_names = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    train_targets = TARGETS

    def train_dataloader(self):
        return DataLoader(TensorDataset(LOGITS, TARGETS), batch_size=2)

    val_dataloader = test_dataloader = train_dataloader

    def predict_dataloader(self):
        return DataLoader(TensorDataset(LOGITS, torch.arange(4)), batch_size=3)


def identity_task(**kwargs) -> MultiLabelClassifier:
    return MultiLabelClassifier(nn.Identity(), num_classes=2, class_names=TAGS, input_shape=None, **kwargs)


def trainer(tmp_path, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kwargs,
    )


def test_validation_logs_map_f1_per_tag_ap_and_chooses_each_tags_f1_best_threshold(tmp_path):
    model = identity_task()
    (result,) = trainer(tmp_path).validate(model, datamodule=TagData(), verbose=False)
    assert result["val/map"] == pytest.approx(1.0) and result["val/f1"] == pytest.approx(1.0)
    assert result["val/ap/cat"] == pytest.approx(1.0) and result["val/ap/dog"] == pytest.approx(1.0)
    assert model.thresholds.tolist() == pytest.approx([0.21, 0.31])
    expected_loss = torch.nn.functional.binary_cross_entropy_with_logits(LOGITS, TARGETS)
    assert result["val/loss"] == pytest.approx(float(expected_loss), rel=1e-5)
    # The test split is judged at the thresholds chosen on validation: 0.5 would miss dog's 0.4 positive.
    (test,) = trainer(tmp_path).test(model, datamodule=TagData(), verbose=False)
    assert test["test/f1"] == pytest.approx(1.0)
    fresh = identity_task()
    (at_half,) = trainer(tmp_path).test(fresh, datamodule=TagData(), verbose=False)
    assert at_half["test/f1"] == pytest.approx((1.0 + 2 / 3) / 2)  # dog: precision 1, recall 1/2


def test_thresholds_and_task_record_survive_the_checkpoint(tmp_path):
    model = identity_task()
    run = trainer(tmp_path)
    run.validate(model, datamodule=TagData(), verbose=False)
    run.save_checkpoint(tmp_path / "m.ckpt")
    checkpoint = torch.load(tmp_path / "m.ckpt", weights_only=True)
    assert checkpoint["task"] == {
        "task": "MultiLabelClassifier",
        "names": TAGS,
        "kind": "tags",
        "outputs": "logits",
        "decode": "sigmoid, then every tag whose probability reaches its threshold",
        "thresholds": [0.21, 0.31],
    }
    loaded = MultiLabelClassifier.load_from_checkpoint(tmp_path / "m.ckpt", net=nn.Identity())
    assert loaded.thresholds.tolist() == pytest.approx([0.21, 0.31])


def test_balanced_pos_weight_comes_from_the_training_tags(tmp_path):
    class Skewed(TagData):
        # 10 images that train: 2 with the first tag, 5 with the second
        train_targets = torch.tensor([[1.0, 1.0]] * 2 + [[0.0, 1.0]] * 3 + [[0.0, 0.0]] * 5)

    model = identity_task(pos_weight="balanced", optimizer=lambda p: torch.optim.SGD(p, lr=0.0))
    model.net = nn.Linear(2, 2)  # something to optimise
    trainer(tmp_path, max_steps=1, num_sanity_val_steps=0, limit_val_batches=0).fit(
        model, datamodule=Skewed()
    )
    assert model.pos_weight.tolist() == pytest.approx([4.0, 1.0])  # negatives / positives per tag
    weighted = model.loss(torch.zeros(1, 2), torch.ones(1, 2))
    assert float(weighted) == pytest.approx(float(np.log(2)) * (4 + 1) / 2)


def test_predict_writes_each_images_tags_and_probabilities(tmp_path):
    model = identity_task()
    run = trainer(tmp_path, callbacks=[PredictionWriter(str(tmp_path / "p.csv"))])
    run.validate(model, datamodule=TagData(), verbose=False)
    run.predict(model, datamodule=TagData(), return_predictions=False)
    rows = list(csv.reader((tmp_path / "p.csv").open()))
    assert rows[0] == ["input", "labels", "p_cat", "p_dog"]
    assert rows[1:] == [
        ["a.jpg", "cat dog", "0.700000", "0.900000"],
        ["b.jpg", "cat", "0.700000", "0.300000"],
        ["c.jpg", "dog", "0.200000", "0.400000"],
        ["d.jpg", "", "0.200000", "0.300000"],
    ]


def test_task_and_data_must_agree_on_what_a_target_is(tmp_path):
    single = ImageClassifier(MLP(num_classes=2, input_shape=(3, 4, 4)), num_classes=2, input_shape=None)
    with pytest.raises(
        UserError,
        match=r"data \(TagData\) gives a set of tags per image but model ImageClassifier takes one class per "
        r"image: train it with --model MultiLabelClassifier \(as configs/csv_multilabel\.yaml",
    ):
        trainer(tmp_path).validate(single, datamodule=TagData(), verbose=False)
    classes = SimpleNamespace(targets=Classes(tuple(TAGS)))
    with pytest.raises(
        UserError,
        match=r"gives one class per image but .*: train it with --model ImageClassifier ",
    ):
        check_task_fits_data(identity_task(), classes)
    check_task_fits_data(single, classes)  # agree: nothing to say
    check_task_fits_data(identity_task(), object())  # a DataModule that does not say: not checked
