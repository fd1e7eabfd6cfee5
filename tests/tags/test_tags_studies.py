"""cv's evaluation of a multi-label task: its probabilities, loss and metrics, per-tag AP and the ensemble's mAP."""

from pathlib import Path

import pytest
import torch

from project.tags.kind import Tags
from tests.tags.test_multilabel import PROBS, TAGS, TagData, identity_task


def test_evaluation_uses_the_tasks_probabilities_loss_and_metrics():
    from project.studies.evaluate import BestModel, evaluate

    class Plain(TagData):
        def setup(self, stage):
            pass

        def transform_batch(self, batch, train):
            return batch

        def load_state_dict(self, state):
            pass

    best = BestModel(identity_task().eval(), Plain(), Path("m.ckpt"), 0, None, None)
    result = evaluate(best, "val")
    assert torch.allclose(result.probs, PROBS, atol=1e-6) and isinstance(result.kind, Tags)
    assert result.metrics == {"val/map": pytest.approx(1.0)}
    assert result.per_class(TAGS) == {"cat": pytest.approx(1.0), "dog": pytest.approx(1.0)}
    assert result.score_name == "map" and result.score == pytest.approx(1.0)
    ensemble = type(result)(result.kind, result.probs * torch.tensor([1.0, -1.0]) + 1, result.targets, 0.0)
    assert ensemble.score == pytest.approx((1.0 + (1 / 3 + 2 / 4) / 2) / 2)  # dog: positives 3rd and 4th
