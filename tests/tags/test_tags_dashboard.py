"""The W&B dashboard of a multi-label validation: per-tag AP and precision-recall curves, not a confusion matrix."""

from types import SimpleNamespace

import pytest

from tests.tags.test_multilabel import LOGITS, TAGS, TARGETS, TagData, identity_task


def test_wandb_dashboard_shows_per_tag_ap_and_pr_curves_not_a_confusion_matrix():
    from project.callbacks.diagnostics.wandb_dashboard import WandbDashboard

    logged = {}
    dashboard = WandbDashboard(watch=None)
    dashboard._logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.update(metrics))  # pyright: ignore[reportAttributeAccessIssue]
    module = identity_task()
    run = SimpleNamespace(
        sanity_checking=False,
        current_epoch=0,
        max_epochs=1,
        training=True,
        is_global_zero=True,
        global_step=3,
        datamodule=TagData(),
        strategy=SimpleNamespace(reduce=lambda t, reduce_op: t),
    )
    dashboard.on_validation_epoch_start(run, module)  # pyright: ignore[reportArgumentType]
    for i in (0, 2):
        batch = (LOGITS[i : i + 2], TARGETS[i : i + 2])
        outputs = {"logits": batch[0], "targets": batch[1]}
        dashboard.on_validation_batch_end(run, module, outputs, batch, i)  # pyright: ignore[reportArgumentType]
    dashboard.on_validation_epoch_end(run, module)  # pyright: ignore[reportArgumentType]
    assert set(logged) == {"val/ap_per_tag", "val/pr_curve"}
    bars = logged["val/ap_per_tag"].table
    assert bars.columns == ["tag", "AP"] and [row[0] for row in bars.data] == TAGS
    assert [row[1] for row in bars.data] == pytest.approx([1.0, 1.0])
    assert logged["val/pr_curve"].table.columns == ["tag", "recall", "precision"]
