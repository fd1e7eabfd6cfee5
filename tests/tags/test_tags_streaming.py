"""A CSV of tags prepared as litdata chunks and streamed back: its multi-hot targets and its recorded kind."""

import json

import pytest
import torch

from project.cli import main
from project.streaming.source import METADATA, StreamingImageDataModule
from tests.conftest import CONFIGS
from tests.test_streaming import prepared  # noqa: F401


@pytest.mark.slow
def test_multilabel_csv_streams_multi_hot_targets(prepared, tmp_path):  # noqa: F811  # (the fixture)
    images = prepared.parent / "images"
    rows = [f"{p.relative_to(images)},{p.parent.name}{' both' if i % 2 else ''}"
            for i, p in enumerate(sorted(images.glob("*/img*")))]  # fmt: skip
    (images / "tags.csv").write_text("path,tags\n" + "\n".join(rows) + "\n")
    out = tmp_path / "tags"
    main(["prepare", "--config", str(CONFIGS / "csv_multilabel.yaml"), "--data.csv", str(images / "tags.csv"),
          "--data.cache_dir", str(tmp_path / "cache"), "--output_dir", str(out), "--size", "16",
          "--num_workers", "1"])  # fmt: skip
    meta = json.loads((out / METADATA).read_text())
    assert meta["classes"] == ["both", "c0", "c1"] and meta["targets"] == "tags"
    data = StreamingImageDataModule(str(out), image_size=8, batch_size=12, num_workers=0)
    data.setup("validate")
    _, targets = next(iter(data.val_dataloader()))
    assert targets.dtype == torch.float32 and targets.shape[1] == 3
    assert ((targets == 0) | (targets == 1)).all() and (targets[:, 1:].sum(1) == 1).all()
