"""A cross-validation's results: each fold's (`fold_result.json`, its best checkpoint evaluated on its validation
fold), their summary over the folds, the optional test-split ensemble, and the Markdown report of them all.
"""

import statistics
from pathlib import Path
from typing import Any

import torch

from project.data.targets import TargetKind
from project.errors import UserError
from project.registry import load
from project.studies.evaluate import Evaluation, evaluate, load_best
from project.studies.tables import markdown_table

RESULT_FILE = "fold_result.json"


def kind_of(results: list[dict[str, Any]]) -> type[TargetKind]:
    """The kind of target the folds were scored on (results written before it was recorded: by their metric)."""
    recorded = results[0].get("kind") or ("tags" if "val/map" in results[0] else "classes")
    return load("target_kinds", recorded)


def metrics_of(results: list[dict[str, Any]]) -> tuple[str, str]:
    """The folds' figures: their quality (the kind's metric: `val/acc`, `val/map`, `val/mae`), and `val/loss`."""
    return (f"val/{kind_of(results).metric}", "val/loss")


def fold_result(fold_dir: Path, fold: int) -> dict[str, Any]:
    """The fold's best checkpoint evaluated on its validation fold."""
    best = load_best(fold_dir)
    result = evaluate(best, "val")
    return {
        "fold": fold,
        "kind": result.kind.kind,
        f"val/{result.score_name}": result.score,
        "val/loss": result.loss,
        "epoch": best.epoch,
        "val_images": len(result.targets),
        "class_acc": result.per_class(best.datamodule.class_names),
        "monitored_best": best.recorded_score,
        "checkpoint": str(best.ckpt_path.absolute()),
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and sample standard deviation over the folds of each metric, and the mean of each name's figure (a
    class's accuracy, a tag's AP, a value's MAE)."""
    summary: dict[str, Any] = {"folds": len(results)}
    for key in (*metrics_of(results), "epoch"):
        values = [float(r[key]) for r in results]
        summary[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values)}
    names = list(results[0]["class_acc"])
    summary["class_acc"] = {
        name: statistics.fmean(r["class_acc"][name] for r in results if r["class_acc"][name] is not None)
        for name in names
    }
    return summary


def test_ensemble_result(fold_dirs: list[Path]) -> dict[str, Any]:
    """The test figure of each fold's best model, and of their average (the mean of what each makes of its outputs:
    probabilities, or values)."""
    singles, probs, targets, kind = [], None, None, None
    for fold_dir in fold_dirs:
        evaluation = evaluate(load_best(fold_dir), "test")
        singles.append(evaluation.score)
        kind = evaluation.kind
        probs = evaluation.probs if probs is None else probs + evaluation.probs
        if targets is not None and not torch.equal(targets, evaluation.targets):
            raise UserError(f"the test split of {fold_dir} differs from the other folds' test split")
        targets = evaluation.targets
    assert probs is not None and targets is not None and kind is not None  # cv has 2 folds or more
    ensemble = Evaluation(kind, probs / len(fold_dirs), targets, float("nan")).score
    name = kind.metric
    return {
        f"test/{name}_ensemble": ensemble,
        f"test/{name}_single": {"mean": statistics.fmean(singles), "std": statistics.stdev(singles)},
        f"test/{name}_per_fold": singles,
        "test_images": len(targets),
    }


def report(results: list[dict[str, Any]], summary: dict[str, Any], ensemble: dict[str, Any] | None) -> str:
    score, loss = metrics_of(results)
    columns = ["fold", score, loss, "best epoch", "val images"]
    rows = [[r["fold"], r[score], r[loss], r["epoch"], r["val_images"]] for r in results]
    rows.append(
        ["mean ± std", *(f"{summary[k]['mean']:.4f} ± {summary[k]['std']:.4f}" for k in (score, loss))]
    )
    rows[-1] += [f"{summary['epoch']['mean']:.1f} ± {summary['epoch']['std']:.1f}", ""]
    text = markdown_table(columns, rows)
    kind = kind_of(results)
    text += f"\nPer-{kind.noun} validation {kind.per_name_words}, mean over folds:\n\n"
    text += markdown_table([kind.noun, f"val/{kind.per_name_metric}"], list(summary["class_acc"].items()))
    if ensemble is not None:
        name = score.removeprefix("val/")
        single = ensemble[f"test/{name}_single"]
        text += (
            f"\nTest split ({ensemble['test_images']} images): ensemble of the {len(results)} folds' best models "
            f"{ensemble[f'test/{name}_ensemble']:.4f}; single folds {single['mean']:.4f} ± {single['std']:.4f}\n"
        )
    return text
