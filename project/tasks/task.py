"""`ImageTask`: what every image task shares; a task (`ImageClassifier`, ...) says what its targets mean.

A task is one LightningModule: the network is injected (a plain `nn.Module`), and the task owns the loss, the
metrics of each stage, the validation metric that picks the best checkpoint (`monitor`, `monitor_mode`), what a
prediction is (`predict_step`, `prediction_header`, `prediction_row`), and what an exported network's outputs
mean (`output_spec`, stored in every checkpoint for export and serving). This base holds the rest: the
optimizer and schedule, the speed switches, test-time augmentation, sharding and clipping, the stage loop.

A task says which kinds of target it accepts (`accepts`, `project.data.targets`): the kind gives the metric it
monitors, how many outputs its network needs and what its outputs mean to deployment. A new task is one subclass
in `project/tasks/` plus a config that names it (`model: {class_path: ...}`): see README "Add a task".
"""

import inspect
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MaxMetric, MeanMetric, MetricCollection, MinMetric

from project.data.targets import Classes, TargetKind
from project.distributed.sharding import clip_fsdp_grad_norm, shard_for_device_mesh
from project.tasks.data_agreement import check_network_outputs, check_task_fits_data
from project.tasks.factories import build_optimizer, check_optimizer, leaves_unset, lr_scales, scaled_max_lr
from project.tasks.tta import tta_logits


def init_arguments(cls: type) -> set[str]:
    """The names of the arguments a class's `__init__` takes, its bases' too (where it passes `**kwargs` on)."""
    return {
        name
        for c in cls.__mro__
        if "__init__" in vars(c)
        for name in inspect.signature(c.__init__).parameters
    }


class ImageTask(L.LightningModule):
    """Trains the injected `net` on image batches `(images, targets)`; subclasses define the targets' meaning.

    Args:
        net: The network (any `nn.Module` mapping images to outputs), injected from the config.
        class_names: The name of each output (classes, tags), in order; linked from the DataModule.
        input_shape: (channels, height, width) of one input; linked from the DataModule. Sets
            `example_input_array`, so the model summary shows every layer's input and output shape.
        optimizer: Optimizer factory, e.g. `class_path: torch.optim.SGD` with `init_args: {lr: 0.1}`.
        scheduler: Optional LR scheduler factory. A schedule with a `total_steps` argument (OneCycleLR) gets
            the trainer's estimated number of optimizer steps when the config leaves it unset.
        scheduler_interval: Step the scheduler every `epoch` or every optimizer `step`; default: `step` for
            schedules with `total_steps` (OneCycle-style), `epoch` otherwise.
        weight_decay_norm_and_bias: Apply the optimizer's weight decay to norm layers and biases too.
            Default off: decaying them only hurts (they set scale and offset, not capacity).
        norm_bias_lr_scale: Learning-rate multiplier for the norm layers' biases (their weight decay is divided
            by it, so their decay per step is unchanged). airbench trains its BatchNorm biases at 64 times the rate,
            with the BatchNorm scales frozen: the shifts then do the work the scales would.
        backbone_lr_scale: Learning-rate multiplier for a pretrained network's backbone, all but the new head
            (`head_parameter_names()`: TimmNet, TorchvisionNet): 0.1 fine-tunes the pretrained layers at a
            tenth of the head's rate. Their weight decay is unchanged.
        layer_decay: Layer-wise learning-rate decay for fine-tuning (BEiT; timm's `--layer-decay`): each
            block learns at this fraction of the rate of the block above it, the stem the least (TimmNet,
            from timm's own grouping of the model's blocks). 0.65-0.85 is usual for ViTs; 1: off.
        tta_flip: Evaluate (val/test/predict) on the mean of the outputs of each image and its mirror image,
            at twice the evaluation cost.
        tta_shift: Also average over the images shifted this many pixels up-left and down-right (airbench's
            TTA level 2; `tasks/tta.py`), at three times the evaluation cost. 0: off.
        channels_last: Store conv weights and inputs NHWC, the layout the fastest convolutions of oneDNN
            (CPUs) and cuDNN (tensor cores under 16-mixed/bf16-mixed) work in. Networks
            without 4-D inputs are unaffected.
        compile: `torch.compile` the network in place (`nn.Module.compile`, so checkpoint keys do not change).
            Pays off on long GPU runs; the first steps are slow while it compiles (minutes on a CPU).
        compile_mode: `torch.compile` mode: `default`, `reduce-overhead` (CUDA graphs, small batches) or
            `max-autotune` (longest compile, fastest kernels).
        float32_matmul_precision: `torch.set_float32_matmul_precision` for fp32 matmuls/convs: `high` lets
            Ampere+ GPUs use TF32 at negligible accuracy cost; no effect on CPU.
        init_from: Start a new fit from the network weights of this checkpoint (another run's `.ckpt`), e.g.
            to fine-tune it onto other classes: every tensor but the output layer's, which starts new when
            the classes differ. Optimizer, schedule and step start afresh; `--ckpt_path` continues a run.
    """

    #: The validation metric that picks the best checkpoint (the default of `checkpoint.monitor`, of `cv`'s
    #: best model and of `tune`'s objective, as `<monitor>_best`), and whether higher is better.
    monitor: ClassVar[str] = "val/loss"
    monitor_mode: ClassVar[Literal["min", "max"]] = "min"
    #: The columns of `predict`'s CSV after the input's name (see `prediction_row`).
    prediction_header: ClassVar[tuple[str, ...]] = ()
    #: The kinds of target the task trains on; the data's must be one of them (`check_task_fits_data`).
    accepts: ClassVar[tuple[type[TargetKind], ...]] = (Classes,)
    #: A shipped config that trains the task, for the message that points a mismatched run to it (None: none).
    example_config: ClassVar[str | None] = "configs/folder.yaml"

    def __init__(
        self,
        net: nn.Module,
        class_names: list[str] | None = None,
        input_shape: tuple[int, int, int] | None = (3, 32, 32),
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] | None = None,
        weight_decay_norm_and_bias: bool = False,
        norm_bias_lr_scale: float = 1.0,
        backbone_lr_scale: float = 1.0,
        layer_decay: float = 1.0,
        tta_flip: bool = False,
        tta_shift: int = 0,
        channels_last: bool = True,
        compile: bool = False,
        compile_mode: Literal["default", "reduce-overhead", "max-autotune"] | None = None,
        float32_matmul_precision: Literal["highest", "high", "medium"] | None = None,
        init_from: str | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if norm_bias_lr_scale <= 0:
            raise ValueError(f"{name}: norm_bias_lr_scale must be > 0, got {norm_bias_lr_scale}")
        if backbone_lr_scale <= 0:
            raise ValueError(f"{name}: backbone_lr_scale must be > 0, got {backbone_lr_scale}")
        if not 0 < layer_decay <= 1:
            raise ValueError(f"{name}: layer_decay must be in (0, 1], got {layer_decay}")
        # A network that cannot say which parameters are its head (or its layers' depths) fails now, not in fit.
        lr_scales(net, backbone_lr_scale, layer_decay)
        if tta_shift < 0:
            raise ValueError(f"{name}: tta_shift must be >= 0, got {tta_shift}")
        check_optimizer(optimizer)  # a negative lr etc. fails now, naming model.optimizer, not inside fit
        # The network is saved with the checkpoint's weights; its config is in the saved CLI config.
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        # LightningCLI records every value linked into the task, also one its class does not take (the data's
        # num_classes, for a task that reads the outputs' number from its class names): such a checkpoint's
        # hyperparameters would not build the task again.
        for key in [k for k in self.hparams if not k.startswith("_") and k not in init_arguments(type(self))]:
            del self.hparams[key]
        self.net, self.optimizer, self.scheduler = net, optimizer, scheduler
        self.class_names = list(class_names or [])
        if input_shape is not None:
            self.example_input_array = torch.zeros(2, *input_shape)
        # One metric object per stage: states must never mix between train, val and test.
        metrics = self.make_metrics()
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        self.val_best = MaxMetric() if self.monitor_mode == "max" else MinMetric()
        self._outputs_checked = False

    # -- what a task defines ----------------------------------------------------------------------------------
    def make_metrics(self) -> MetricCollection:
        """The metrics of one stage, updated with `(outputs, targets)`; logged as `<stage>/<name>`."""
        raise NotImplementedError

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The training objective of a batch's network outputs against its targets."""
        raise NotImplementedError

    def update_metrics(self, metrics: MetricCollection, outputs: Tensor, targets: Tensor) -> None:
        """Feed one batch to a stage's metrics (`metrics.prefix` names the stage)."""
        metrics.update(outputs, targets)

    def probabilities(self, outputs: Tensor) -> Tensor:
        """The network's outputs as what they stand for, probabilities or values (evaluation, ensembles)."""
        raise NotImplementedError

    @property
    def targets(self) -> TargetKind:
        """The kind of target the task predicts, over its `class_names`: the first it accepts."""
        return self.accepts[0](tuple(self.class_names))

    @property
    def network_outputs(self) -> int:
        """How many outputs per image the task needs its network to give: the kind's (one per class, tag or
        value). The data's `num_classes`, linked into the network, is that number for every shipped task."""
        return self.targets.outputs

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Per input of the batch: its dataset `index` and what the task predicts for it."""
        raise NotImplementedError

    def prediction_columns(self) -> tuple[str, ...]:
        """The CSV's columns after the input's name: `prediction_header`, and any that depend on the names."""
        return self.prediction_header

    def prediction_row(self, prediction: dict[str, Any], i: int) -> list[Any]:
        """The CSV cells (after the input's name) of input `i` of a `predict_step` result, made plain lists."""
        raise NotImplementedError

    def output_spec(self) -> dict[str, Any]:
        """What the network's outputs mean, for export and serving (stored in checkpoints as `task`): the kind's
        account of them (`TargetKind.output_spec`), read by `project.export.decoding`."""
        return {"task": type(self).__name__, "names": list(self.class_names)} | self.targets.output_spec()

    # -- the stage loop -----------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        # Speed switches are applied here, once per process, before the strategy wraps the module.
        hp = self.hparams
        if stage == "fit" and hp.get("init_from"):  # before any reshaping; a resumed run's checkpoint wins
            from project.run.init_from import load_matching_weights  # (only runs that use it import it)

            load_matching_weights(self, hp["init_from"])
        if hp["float32_matmul_precision"] is not None:
            torch.set_float32_matmul_precision(hp["float32_matmul_precision"])
        # Once: setup runs again for a test after the fit, on a network a strategy may have wrapped by then.
        if hp["channels_last"] and not getattr(self, "_channels_last", False):
            self.net.to(memory_format=torch.channels_last)
            self._channels_last = True
        if hp["compile"] and not getattr(self, "_compiled", False):
            self.net.compile(mode=hp["compile_mode"])
            self._compiled = True
        # Here, for every way a run is built (the CLI, a script, a study): a task that reads the targets another
        # way than the data gives them (cross-entropy on multi-hot rows) would train on them without an error.
        check_task_fits_data(self, getattr(self._trainer, "datamodule", None))

    def forward(self, x: Tensor) -> Tensor:
        if self.hparams["channels_last"] and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.training or not (self.hparams["tta_flip"] or self.hparams["tta_shift"]):
            return self.net(x)
        return tta_logits(self.net, x, self.hparams["tta_flip"], self.hparams["tta_shift"])

    def _shared_step(
        self, batch: tuple[Tensor, ...], metrics: MetricCollection, loss_metric: MeanMetric
    ) -> tuple[Tensor, Tensor]:
        """Forward, loss and metric updates shared by train/val/test: returns (loss, outputs)."""
        # A mixed training batch (MixUp/CutMix) is (images, soft targets, each image's own targets): the metrics
        # count an image right when it gets its own label, as without mixing (a mixture's argmax may be the other's).
        x, y, *own = batch
        outputs = self(x)
        if not self._outputs_checked:
            check_network_outputs(self, outputs)
            self._outputs_checked = True
        loss = self.loss(outputs, y)
        self.update_metrics(metrics, outputs.detach(), own[0] if own else y)
        loss_metric.update(loss.detach(), weight=y.shape[0])
        return loss, outputs

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss, _ = self._shared_step(batch, self.train_metrics, self.train_loss)
        self.log("loss", loss, prog_bar=True, logger=False)  # the step's loss, for the progress bar
        return loss

    def on_train_epoch_end(self) -> None:
        # The epoch means (over all ranks) go to the loggers, logged once from the states every step updated:
        # a log call per batch costs more than the update itself.
        self.log("train/loss", self.train_loss)
        self.log_dict(self.train_metrics)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        loss, outputs = self._shared_step(batch, self.val_metrics, self.val_loss)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log_dict(self.val_metrics, on_step=False, on_epoch=True, prog_bar=False)
        # Returned for callbacks (confusion matrix, worst predictions) via on_validation_batch_end's outputs.
        return {"loss": loss.detach(), "logits": outputs.detach(), "targets": batch[1]}

    def monitored_value(self) -> Tensor:
        """This validation's value of `monitor` (compute() syncs across ranks: over the whole split)."""
        name = self.monitor.removeprefix("val/")
        return self.val_loss.compute() if name == "loss" else self.val_metrics[f"val/{name}"].compute()

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        self.val_best.update(self.monitored_value())
        # Already the same on every rank; sync_dist only tells Lightning so (and costs one scalar all-reduce).
        self.log(f"{self.monitor}_best", self.val_best.compute(), prog_bar=True, sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Metric states are not in the state_dict: keep the best validation value, so that a resumed run
        # reports the best of the whole run, not the best since it was resumed.
        best = self.val_best.compute() if self.val_best.update_count else None
        checkpoint["monitor_best"] = {"monitor": self.monitor, "value": best}
        checkpoint["task"] = self.output_spec()
        # What the outputs were trained on: a command that starts from the checkpoint checks its data against
        # it (project.run.data_identity).
        source = getattr(self._trainer, "datamodule", None)
        kind = getattr(source, "targets", None)
        checkpoint["data_identity"] = {
            "kind": (kind if isinstance(kind, TargetKind) else self.targets).kind,
            "names": self._data_names(),
            "source": type(source).__name__ if source is not None else None,
        }

    def _data_names(self) -> list[str]:
        """The names of the data's classes or tags where the trainer has the data (a task built in a script
        may hold only the placeholders `0, 1, ...`), else the task's own, which the CLI links from the data."""
        names = getattr(getattr(self._trainer, "datamodule", None), "class_names", None)
        return list(names or self.class_names)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if (
            self._trainer is not None
        ):  # (load_from_checkpoint builds the task from the checkpoint's own names)
            from project.run.averaged_resume import reconcile_weight_average
            from project.run.data_identity import check_same_names, recorded_names

            fitting = self._trainer.state.fn == "fit"
            check_same_names(recorded_names(checkpoint), self._data_names(), self._trainer.ckpt_path, fitting)
            reconcile_weight_average(self._trainer, checkpoint)
        best = checkpoint.get("monitor_best") or {}
        if best.get("value") is not None and best.get("monitor") == self.monitor:
            self.val_best.reset()
            self.val_best.update(best["value"])

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, self.test_metrics, self.test_loss)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True)
        self.log_dict(self.test_metrics, on_step=False, on_epoch=True)

    # -- sharding, clipping, optimisation -----------------------------------------------------------------------
    def configure_model(self) -> None:
        # FSDP2 (configs/trainer/fsdp2*.yaml) shards the network here, before the optimizer is built; DDP and
        # FSDPStrategy wrap the module on their own. `load_from_checkpoint` calls this with no trainer (no mesh).
        if self.device_mesh is not None:
            shard_for_device_mesh(self.net, self.device_mesh, self.trainer.strategy)

    def configure_gradient_clipping(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Under FSDPStrategy, norm clipping needs FSDP's own (each rank holds only its shard of the gradients).
        model = self.trainer.model
        if model is None or not clip_fsdp_grad_norm(model, gradient_clip_val, gradient_clip_algorithm):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> Any:
        # Parameters come from trainer.model: under FSDP that is the sharded module the optimizer must see.
        try:
            model = self.trainer.model
        except RuntimeError:  # not attached to a Trainer (a test building the optimizer directly)
            model = self
        assert model is not None  # the strategy holds the module from `connect`, before this hook runs
        hp = self.hparams
        scales = (hp["norm_bias_lr_scale"], hp.get("backbone_lr_scale", 1.0), hp.get("layer_decay", 1.0))
        optimizer = build_optimizer(self.optimizer, model, hp["weight_decay_norm_and_bias"], *scales)
        if self.scheduler is None:
            return optimizer
        kwargs, interval = {}, hp["scheduler_interval"]
        if (max_lr := scaled_max_lr(self.scheduler, optimizer)) is not None:
            kwargs["max_lr"] = max_lr
        if leaves_unset(self.scheduler, "total_steps"):
            # OneCycleLR divides by zero below ~1/pct_start steps; runs that short (debug runs) are padded.
            kwargs["total_steps"] = max(int(self.trainer.estimated_stepping_batches), 100)
            interval = interval or "step"
        scheduler = self.scheduler(optimizer, **kwargs)
        # "name" is what LearningRateMonitor logs the learning rate under.
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": interval or "epoch", "name": "train/lr"},
        }
