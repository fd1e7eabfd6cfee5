"""`NetworkSummary`: Lightning's model summary of the network's layers, without the task's metric objects."""

from typing import Any

from lightning.pytorch.callbacks import RichModelSummary
from torchmetrics import Metric, MetricCollection


class NetworkSummary(RichModelSummary):
    """Lightning's model summary of the network's layers: the task's metric objects (accuracies, running means,
    the best score so far) hold no parameters and would fill most of its rows.

    Args:
        max_depth: How deep into the network the rows go (0: none; -1: every layer).
    """

    def __init__(self, max_depth: int = 2) -> None:
        # Spelled out: resolving Lightning's `**summarize_kwargs` reads the source of both of its summary classes
        # while the command line is parsed, on every run.
        super().__init__(max_depth=max_depth)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        RichModelSummary.summarize(
            without_metrics(summary_data),
            total_parameters,
            trainable_parameters,
            model_size,
            total_training_modes,
            total_flops,
            **summarize_kwargs,
        )


def without_metrics(summary_data: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The columns of a model summary without the rows of torchmetrics modules, the rows numbered again."""
    metric_types = {MetricCollection.__name__} | {cls.__name__ for cls in subclasses(Metric)}
    kept = [i for i, name in enumerate(dict(summary_data)["Type"]) if name not in metric_types]
    columns = [(column, [values[i] for i in kept]) for column, values in summary_data]
    return [
        (column, [str(n) for n in range(len(kept))] if column == " " else values)
        for column, values in columns
    ]


def subclasses(cls: type) -> set[type]:
    """Every class imported so far that derives from `cls`."""
    direct = set(cls.__subclasses__())
    return direct.union(*(subclasses(sub) for sub in direct))
