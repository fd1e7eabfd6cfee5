"""`QuantizationAwareTraining`: fine-tune with simulated INT8, then save a real INT8 model (x86, torchao PT2E).

Lightning 2 has no QAT callback, and `torch.ao.quantization` (what Lightning 1.x used) is deprecated. This one
uses torchao's PT2E flow (see `project.compression.pt2e` for why): from `start_epoch` the network is captured with
`torch.export`, conv+BatchNorm(+ReLU) are fused for QAT and fake quantization is inserted for the x86 backend;
later epochs freeze the BatchNorm statistics, then the quantization ranges; at the end of fit the model is
converted to INT8, saved beside the checkpoints, and its validation accuracy is reported next to the float
model's.
"""

from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelPruning
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torch.fx import GraphModule

from project.compression import pt2e
from project.compression.epochs import resolve_epoch
from project.compression.int8_program import save_int8
from project.compression.qat_report import evaluate_int8, int8_metadata
from project.errors import UserError


class QuantizationAwareTraining(Callback):
    """Quantization-aware training for INT8 inference on x86 CPUs.

    Epochs may be negative, counting from the end of training (`-5`: the fifth-to-last epoch), so one config
    fits runs of any length. Train in float first: QAT is a fine-tuning phase of a few epochs.

    Checkpoints written during QAT stay loadable into the float network (a fresh `ImageClassifier`): the fake
    quantization state travels in this callback's checkpoint state, and resuming (or `validate`/`test` from
    such a checkpoint with this callback configured) restores the fake-quantized model.

    Args:
        start_epoch: First epoch trained with fake quantization.
        freeze_bn_epoch: From this epoch on, BatchNorm uses its running statistics (no more updates), so the
            conv+BN fold used in training matches the INT8 model exactly. `null`: never.
        freeze_observers_epoch: From this epoch on, the quantization ranges (scales, zero points) are fixed.
            Must come after `start_epoch` (the ranges must first be observed). `null`: never.
        reduce_range: 7-bit activations, for CPUs without VNNI (pre-2019 x86), where 8 bits can overflow.
        filename: Name of the INT8 model (`torch.export` program), saved in the checkpoint folder.
        evaluate: At the end of fit, report validation accuracy of the float, fake-quantized and INT8 models.
        module_name: Attribute of the LightningModule holding the network to quantize.
    """

    def __init__(
        self,
        start_epoch: int = -5,
        freeze_bn_epoch: int | None = -3,
        freeze_observers_epoch: int | None = -2,
        reduce_range: bool = False,
        filename: str = "model_int8.pt2",
        evaluate: bool = True,
        module_name: str = "net",
    ) -> None:
        super().__init__()
        if not filename.endswith(".pt2"):
            raise UserError(f"QuantizationAwareTraining.filename must end in .pt2, got {filename!r}")
        self.start_epoch = start_epoch
        self.freeze_bn_epoch = freeze_bn_epoch
        self.freeze_observers_epoch = freeze_observers_epoch
        self.reduce_range = reduce_range
        self.filename = filename
        self.evaluate = evaluate
        self.module_name = module_name
        self.prepared = False
        self.bn_frozen = False
        self.observers_frozen = False
        self.example_shape: tuple[int, ...] | None = None
        self.int8_path: Path | None = None
        self.report: dict[str, Any] = {}
        self._float_keys: set[str] = set()
        self._float_net: nn.Module | None = None  # the network as it was before fake quantization
        self._epochs: dict[str, int | None] = {}
        self._epoch_seen = -1

    # -- schedule -------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.precision not in ("32-true", "32"):
            raise UserError(
                "QuantizationAwareTraining simulates INT8 on float32 tensors: set --trainer.precision 32-true "
                f"(got {trainer.precision!r})"
            )
        if not isinstance(getattr(pl_module, self.module_name, None), nn.Module):
            raise UserError(
                f"QuantizationAwareTraining.module_name={self.module_name!r}: {type(pl_module).__name__} has no "
                "such network attribute"
            )
        max_epochs = trainer.max_epochs
        start = resolve_epoch(self.start_epoch, max_epochs, "QuantizationAwareTraining.start_epoch")
        self._epochs = {"start": start, "bn": None, "observers": None}
        if self.freeze_bn_epoch is not None:
            self._epochs["bn"] = max(
                start,
                resolve_epoch(self.freeze_bn_epoch, max_epochs, "QuantizationAwareTraining.freeze_bn_epoch"),
            )
        if self.freeze_observers_epoch is not None:
            observers = resolve_epoch(
                self.freeze_observers_epoch, max_epochs, "QuantizationAwareTraining.freeze_observers_epoch"
            )
            if observers <= start:
                rank_zero_info(
                    f"QuantizationAwareTraining: freeze_observers_epoch ({observers}) is not after start_epoch "
                    f"({start}); the quantization ranges keep adapting (they must be observed first)"
                )
            else:
                self._epochs["observers"] = observers
        self._check_pruning(trainer, start)

    def _check_pruning(self, trainer: L.Trainer, start: int) -> None:
        # Pruning masks are forward pre-hooks on eager modules, which an exported graph does not run.
        from project.compression.pruning import ProgressivePruning

        # Trainer.callbacks is set by Lightning's callback connector, outside the class: pyright cannot see it.
        for callback in trainer.callbacks:  # pyright: ignore[reportAttributeAccessIssue]
            if isinstance(callback, ProgressivePruning):
                end = callback.resolved_end_epoch(trainer)
                # Equal is fine: the last pruning step comes at the epoch's start, QAT at its first batch.
                if end > start:
                    raise UserError(
                        f"pruning ends at epoch {end} but quantization-aware training starts at epoch {start}: "
                        "pruning must end first (set ProgressivePruning.end_epoch no later than "
                        "QuantizationAwareTraining.start_epoch)"
                    )
            elif isinstance(callback, ModelPruning):
                raise UserError(
                    "QuantizationAwareTraining works with ProgressivePruning (which makes pruning permanent before "
                    f"QAT starts), not with {type(callback).__name__}"
                )

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # At the first batch rather than at epoch start: after every callback's on_train_epoch_start (the last
        # pruning step, which must precede the capture of the network).
        epoch = trainer.current_epoch
        if epoch == self._epoch_seen:
            return
        self._epoch_seen = epoch
        if not self.prepared and self._due("start", epoch):
            self._prepare(pl_module, self._example_shape(pl_module))
            rank_zero_info(
                f"QuantizationAwareTraining: epoch {epoch}: fake quantization inserted (x86 INT8: per-channel int8 "
                "weights, uint8 activations, conv+BN folded)"
            )
        if self.prepared and not self.bn_frozen and self._due("bn", epoch):
            pt2e.freeze_batchnorm(self._graph(pl_module))
            self.bn_frozen = True
            rank_zero_info(f"QuantizationAwareTraining: epoch {epoch}: BatchNorm statistics frozen")
        if self.prepared and not self.observers_frozen and self._due("observers", epoch):
            pt2e.freeze_observers(self._graph(pl_module))
            self.observers_frozen = True
            rank_zero_info(f"QuantizationAwareTraining: epoch {epoch}: quantization ranges frozen")

    def _due(self, event: str, epoch: int) -> bool:
        target = self._epochs.get(event)
        return target is not None and epoch >= target

    def _example_shape(self, pl_module: L.LightningModule) -> tuple[int, ...]:
        example = getattr(pl_module, "example_input_array", None)
        if not isinstance(example, Tensor):
            raise UserError(
                f"QuantizationAwareTraining needs {type(pl_module).__name__}.example_input_array (one input "
                "batch) to capture the network; ImageClassifier sets it from input_shape"
            )
        return tuple(example.shape[1:])

    def _net(self, pl_module: L.LightningModule) -> nn.Module:
        return getattr(pl_module, self.module_name)

    def _graph(self, pl_module: L.LightningModule) -> GraphModule:
        # Once prepared, the network attribute holds the GraphModule that _prepare put there.
        return cast(GraphModule, self._net(pl_module))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # A fit tests its best checkpoint with the network still fake-quantized, but the checkpoint holds float
        # weights (the fake quantization state rides in this callback's state, restored by on_load_checkpoint
        # after Lightning loads the weights): the float network, with the weights trained, goes back first.
        if stage == "fit" or not self.prepared or self._float_net is None:
            return
        prefix = f"{self.module_name}."
        trained = self._graph(pl_module).state_dict()
        self._float_net.load_state_dict(
            {k: v for k, v in trained.items() if prefix + k in self._float_keys}, strict=True
        )
        setattr(pl_module, self.module_name, self._float_net)
        self.prepared = self.bn_frozen = self.observers_frozen = False

    def _prepare(self, pl_module: L.LightningModule, example_shape: tuple[int, ...]) -> None:
        net = self._net(pl_module)
        self._float_net = net
        self._float_keys = set(pl_module.state_dict())
        example = torch.zeros(2, *example_shape, device=pl_module.device)
        was_training = net.training
        prepared = pt2e.prepare_qat(net, example, reduce_range=self.reduce_range)
        prepared.train(was_training)
        setattr(pl_module, self.module_name, prepared)
        self.example_shape = tuple(example_shape)
        self.prepared = True

    # -- checkpoints: float-loadable state_dict, fake-quantization state in the callback's state -------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "prepared": self.prepared,
            "bn_frozen": self.bn_frozen,
            "observers_frozen": self.observers_frozen,
            "example_shape": list(self.example_shape or []),
        }

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if not self.prepared:
            return
        state = checkpoint["state_dict"]
        fake_quant = {k: state.pop(k) for k in list(state) if k not in self._float_keys}
        if "callbacks" in checkpoint:  # weights-only checkpoints keep the float model only
            checkpoint["callbacks"].setdefault(self.state_key, self.state_dict())["fake_quant"] = fake_quant

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        if not state or not state.get("prepared") or self.prepared:
            return
        # Lightning has loaded the float weights into the eager network: capture it, then restore the ranges.
        self._prepare(pl_module, tuple(state["example_shape"]))
        net = self._graph(pl_module)
        prefix = f"{self.module_name}."
        fake_quant = {k.removeprefix(prefix): v for k, v in state.get("fake_quant", {}).items()}
        missing = set(net.state_dict()) - {k.removeprefix(prefix) for k in self._float_keys} - set(fake_quant)
        if missing:
            raise UserError(
                f"the checkpoint's quantization-aware training state does not fit the network: {len(missing)} "
                f"fake-quantization entries missing (e.g. {sorted(missing)[0]}). Was it trained with another network?"
            )
        net.load_state_dict(fake_quant, strict=False)
        if state.get("bn_frozen"):
            pt2e.freeze_batchnorm(net)
            self.bn_frozen = True
        if state.get("observers_frozen"):
            pt2e.freeze_observers(net)
            self.observers_frozen = True

    # -- the INT8 model -------------------------------------------------------------------------------------
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        example_shape = self.example_shape  # set by _prepare, together with `prepared`
        if not self.prepared or example_shape is None:
            rank_zero_warn(
                f"QuantizationAwareTraining: training ended (epoch {trainer.current_epoch}) before QAT started "
                f"(epoch {self._epochs.get('start')}): no INT8 model was saved"
            )
            return
        if not trainer.is_global_zero:
            return
        prepared = self._graph(pl_module)
        int8 = pt2e.convert(prepared)
        self.report = evaluate_int8(trainer, pl_module, prepared, int8) if self.evaluate else {}
        dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
        folder = Path(dirpath) if dirpath else Path(trainer.log_dir or trainer.default_root_dir)
        backend = "torchao PT2E, X86InductorQuantizer" + (" (reduce_range)" if self.reduce_range else "")
        metadata = int8_metadata(trainer, pl_module, example_shape, backend, self.report)
        self.int8_path = save_int8(int8, folder / self.filename, torch.zeros(2, *example_shape), metadata)
        rank_zero_info(f"QuantizationAwareTraining: INT8 model saved to {self.int8_path}")
        if self.report:
            for logger in trainer.loggers:
                logger.log_metrics({f"qat/{k}": v for k, v in self.report.items()}, step=trainer.global_step)
            rank_zero_info(
                "QuantizationAwareTraining: validation accuracy  float {val_acc_float:.4f} | fake-quantized "
                "{val_acc_fake_quant:.4f} | INT8 {val_acc_int8:.4f}  (INT8 agrees with fake-quantized top-1 on "
                "{int8_agreement:.2%})".format(**self.report)
            )
