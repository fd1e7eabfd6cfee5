"""What a trained network's outputs mean, and how they become answers: the decoder of its kind of target.

The task records its kind in every checkpoint (`ImageTask.output_spec`, the `task` entry, copied into an export's
model.json): `kind` names a registered kind of target (absent: one class per image), `names` its outputs.
`decoder_for` asks that kind (`TargetKind.decoder`) for the object `export`, `predict_onnx`, `serve` and
`quantize` use: what to export (the network, or the network followed by its activation or un-standardisation),
how raw outputs become probabilities (or values), the CSV row and HTTP answer of one image, and the quality
figure of a batch. A new kind of target brings its decoder with it.
"""

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
from torch import Tensor, nn

from project.data.targets import kind_named
from project.errors import UserError

Array = TypeVar("Array", np.ndarray, Tensor)


class Decoder(Protocol):
    """How the outputs of one kind of task are read (see the module docstring)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    #: The quality figure `score` returns, and what `agreement` compares, as the quantization report says them.
    quality: ClassVar[str]
    agrees: ClassVar[str]
    quality_note: ClassVar[str]
    #: The name of an exported model's output (ONNX).
    output_name: ClassVar[str]

    def deployable(self, net: nn.Module) -> nn.Module:
        """What `export` writes: the network, or the network with its outputs made probabilities."""
        ...

    def exported(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The task record of what `deployable` returns, for model.json."""
        ...

    def probabilities(self, outputs: Array) -> Array:
        """Outputs (B, names) -> probabilities (numpy or torch, as given)."""
        ...

    def csv_header(self) -> list[str]: ...

    def csv_row(self, probs: np.ndarray) -> list[Any]:
        """The CSV cells of one image's probabilities (after its name)."""
        ...

    def answer(self, probs: np.ndarray, top_k: int = 1) -> dict[str, Any]:
        """`serve`'s JSON answer for one image's probabilities."""
        ...

    def describe(self) -> dict[str, Any]:
        """What `serve`'s /info adds about the outputs."""
        ...

    def reduce(self, outputs: np.ndarray) -> np.ndarray:
        """What `score` and `agreement` need of a batch's outputs (kept for a whole split: small)."""
        ...

    def score(self, reduced: np.ndarray, targets: np.ndarray) -> float:
        """The quality figure of a split (quantize): top-1 accuracy, or mAP."""
        ...

    def agreement(self, reduced: np.ndarray, reference: np.ndarray) -> float:
        """The fraction of images on which two variants give the same answer."""
        ...


def decoder_for(spec: Mapping[str, Any] | None, names: Sequence[str]) -> Decoder:
    """The decoder of a checkpoint's or export's task record; `names` when the record lists none."""
    spec = spec or {}
    kind, names = spec.get("kind", "classes"), list(spec.get("names") or names)
    try:
        target_kind = kind_named(kind, names)
    except ValueError:
        raise UserError(
            f"the model's outputs are of kind {kind!r}, which this version cannot decode"
        ) from None
    return target_kind.decoder(spec)


def deployed(
    net: nn.Module, spec: Mapping[str, Any] | None, names: Sequence[str]
) -> tuple[nn.Module, dict[str, Any], Decoder]:
    """(what an export of `net` holds, its task record, the decoder of its outputs) for a checkpoint's
    task record `spec`: a single-label network as it is, a multi-label one followed by its sigmoid."""
    exported = decoder_for(spec, names).exported(dict(spec or {}))
    return decoder_for(spec, names).deployable(net), exported, decoder_for(exported, names)
