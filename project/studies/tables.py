"""A study's result tables: Markdown for reading, the JSON beside it (written all or none), and a W&B table.

`cv` writes its summary (`cv_results.md`, `cv_results.json`) and `tune` its trials (`trials.md`, `trials.json`,
`best_config.yaml`) through `write_results`, so a killed study never leaves one file without the others.
"""

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from project.atomic_files import staged_outputs


def _cell(value: Any) -> str:
    if isinstance(value, float):  # metrics to 4 decimals; learning rates and the like keep their digits
        return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e4 else f"{value:.3e}"
    return str(value).replace("|", "\\|")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]) + "\n"


def write_results(
    folder: Path, stem: str, markdown: str, payload: dict[str, Any], extra: dict[str, str]
) -> None:
    """`<stem>.md`, `<stem>.json` and the `extra` files (name -> text) in `folder`, all or none."""
    with staged_outputs(folder) as staging:
        (staging / f"{stem}.md").write_text(markdown)
        (staging / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
        for name, text in extra.items():
            (staging / name).write_text(text)


def log_table(
    key: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    summary: dict[str, Any],
    folder: Path,
    project: str,
    group: str,
    job_type: str,
) -> str:
    """Log a table (and summary values) to a W&B run in `group`; offline unless WANDB_MODE says otherwise, like
    the training runs. Returns the run's folder."""
    import wandb

    from project.redaction import redacted_argv

    with redacted_argv():  # wandb records the command line (a storage URL's password) in the run's metadata
        run = wandb.init(
            project=project,
            dir=str(folder),
            group=group,
            job_type=job_type,
            name=f"{group}-{job_type}",
            # WANDB_MODE, when set, wandb reads and checks itself (its older names `dryrun` and `run` included).
            mode=None if "WANDB_MODE" in os.environ else "offline",
            reinit="finish_previous",
        )
    try:
        table = wandb.Table(columns=list(columns), data=[list(row) for row in rows], allow_mixed_types=True)
        run.log({key: table})
        run.summary.update(summary)
        return str(run.dir)
    finally:
        run.finish()
