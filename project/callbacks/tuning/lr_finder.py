"""`LRFinder`: Lightning's learning-rate range test, with the suggestion printed, plotted and logged."""

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.loggers import WandbLogger

from project.atomic_files import atomic_write_text
from project.callbacks.tuning.shared import override_factory, rebuild_optimizers, report, stop_after_tuning
from project.errors import UserError
from project.tasks.factories import takes_argument

if TYPE_CHECKING:
    from lightning.pytorch.tuner.lr_finder import _LRFinder


class LRFinder(LearningRateFinder):
    """Finds a learning rate before training with a range test (Smith, 2015; Lightning's LearningRateFinder).

    From a saved copy of the model, the learning rate grows from `min_lr` to `max_lr` over
    `num_training_steps` training batches while the loss is recorded; the model is then restored. The
    suggestion is the learning rate where the loss falls fastest. It is printed with the flag that sets
    it, logged as `tuning/lr_suggestion`, and the loss-vs-learning-rate plot (suggestion marked) is
    saved to `lr_find.png` in the run's log directory and logged to W&B as `tuning/lr_find`.

    Args:
        min_lr: Smallest learning rate tried.
        max_lr: Largest learning rate tried.
        num_training_steps: Batches in the test (one learning rate each). The training set must have at
            least this many batches per epoch (mind `limit_train_batches`).
        mode: `exponential` (evenly spaced on a log scale, the usual choice) or `linear` steps.
        early_stop_threshold: Stop the test once the loss exceeds this multiple of the best loss so far
            (null: never stop early).
        apply: False: stop after the test (a tuning-only run). True: go on training with the suggestion
            as the optimizer's `lr` (and as OneCycleLR's `max_lr`), rebuilding optimizer and schedule.
        plot_path: Where the plot goes (the curve goes beside it, as .csv). Default: `lr_find.png` in the
            run's log directory.
    """

    def __init__(
        self,
        min_lr: float = 1e-7,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: Literal["exponential", "linear"] = "exponential",
        early_stop_threshold: float | None = 4.0,
        apply: bool = False,
        plot_path: str | None = None,
    ) -> None:
        if not 0 < min_lr < max_lr:
            raise UserError(f"LRFinder: need 0 < min_lr < max_lr, got min_lr={min_lr}, max_lr={max_lr}")
        if num_training_steps < 20:
            # The suggestion skips the first 10 points and needs a few more to measure a slope.
            raise UserError(f"LRFinder: num_training_steps must be at least 20, got {num_training_steps}")
        # update_attr=False: the suggestion is applied below, to the optimizer factory, not to a `model.lr`.
        super().__init__(min_lr, max_lr, num_training_steps, mode, early_stop_threshold, update_attr=False)
        self.min_lr, self.max_lr, self.num_training_steps = min_lr, max_lr, num_training_steps
        self.apply = apply
        self.plot_path = plot_path
        self.suggestion: float | None = None

    def lr_find(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().lr_find(trainer, pl_module)
        if self.optimal_lr is None:  # fast_dev_run: Lightning skips the test (and says so)
            return
        finder = self.optimal_lr
        lr = finder.suggestion()
        losses = finder.results.get("loss", [])
        if lr is None or not math.isfinite(lr):
            raise UserError(
                f"LRFinder: no suggestion from {len(losses)} recorded losses (more than 11 are needed): the loss "
                "diverged right away, or the run has fewer training batches than num_training_steps="
                f"{self.num_training_steps} (limit_train_batches x max_epochs). Lower max_lr, or allow more batches."
            )
        self.suggestion = lr
        saved = self._save_curve(trainer, finder)

        flags = f"--model.optimizer.init_args.lr {lr:.3g}"
        scheduler = getattr(pl_module, "scheduler", None)
        if scheduler is not None and takes_argument(scheduler, "max_lr"):
            flags += f" --model.scheduler.init_args.max_lr {lr:.3g}"
        action = "Training continues with it" if self.apply else "Train with"
        report(
            trainer,
            f"LR finder: suggested learning rate {lr:.3g} (steepest loss descent over "
            f"{len(losses)} steps from {self.min_lr:g} to {self.max_lr:g}); {saved}\n"
            f"LR finder: {action}: {flags}",
            {"tuning/lr_suggestion": lr},
        )
        if not self.apply:
            stop_after_tuning()
        self._apply(trainer, pl_module, lr)

    def _save_curve(self, trainer: L.Trainer, finder: "_LRFinder") -> str:
        """The curve as CSV and, with matplotlib, as a plot; says where they are."""
        path = Path(self.plot_path or Path(trainer.log_dir or trainer.default_root_dir) / "lr_find.png")
        curve = path.with_suffix(".csv")
        plots = importlib.util.find_spec("matplotlib") is not None  # the `plots` extra
        if trainer.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
            rows = zip(finder.results.get("lr", []), finder.results.get("loss", []), strict=True)
            atomic_write_text(curve, "lr,loss\n" + "".join(f"{lr!r},{loss!r}\n" for lr, loss in rows))
            if plots:
                self._save_plot(trainer, finder, path)
        if not plots:
            return f"curve: {curve} (for a plot, install matplotlib: pip install -e '.[plots]')"
        return f"curve: {curve}, plot: {path}"

    def _save_plot(self, trainer: L.Trainer, finder: "_LRFinder", path: Path) -> None:
        import matplotlib  # pyright: ignore[reportMissingImports]  # the `plots` extra

        matplotlib.use("Agg")  # files only: works without a display
        import matplotlib.pyplot as plt  # pyright: ignore[reportMissingImports]

        # Without an `ax` to draw into, plot() makes its own Figure (plt.subplots()).
        fig: Any = finder.plot(suggest=True, show=False)
        fig.axes[0].set_title(f"Learning-rate range test: suggestion {finder.suggestion():.3g}")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key="tuning/lr_find", images=[str(path)], step=trainer.global_step)

    def _apply(self, trainer: L.Trainer, pl_module: L.LightningModule, lr: float) -> None:
        if not callable(getattr(pl_module, "optimizer", None)):
            raise UserError(
                f"LRFinder(apply=True) needs a LightningModule that builds its optimizer from an `optimizer` "
                f"factory (like ImageClassifier); {type(pl_module).__name__} has none. Set the printed "
                "learning rate in your config instead."
            )
        override_factory(pl_module, "optimizer", lr=lr)
        scheduler = getattr(pl_module, "scheduler", None)
        if scheduler is not None and takes_argument(scheduler, "max_lr"):
            override_factory(pl_module, "scheduler", max_lr=lr)
        rebuild_optimizers(trainer)
