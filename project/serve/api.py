"""`ClassifierAPI`: the LitServe API behind `python -m project serve` (POST an image, get its class, or its
tags for a multi-label model: the answer is the task's own, `project.export.decoding`).

Requests arrive as multipart form uploads (field `file`); FastAPI reads the field into bytes in the
HTTP process, and LitServe hands them to the inference worker, which decodes, batches and classifies.
A bad upload (not an image, too many pixels, empty) is answered with a 4xx JSON error of its own, and
never fails the other requests that happen to share its batch.
"""

import io
from dataclasses import dataclass
from typing import Annotated, Any

import litserve as ls
import numpy as np
import torch
from fastapi import File
from fastapi.responses import JSONResponse
from PIL import UnidentifiedImageError

from project.data.image_reading import ImageTooLarge, open_image
from project.errors import UserError
from project.export.decoding import Decoder, decoder_for
from project.export.preprocessing import Preprocessing, read_metadata
from project.export.runtimes import exported_runtime

UploadedFile = Annotated[bytes, File(alias="file", description="the image (any format PIL reads)")]


@dataclass
class Rejected:
    """An upload that cannot be classified: answered with `status` and `detail`, not passed to the model."""

    status: int
    detail: str


class ClassifierAPI(ls.LitAPI):
    """Classifies uploaded images with a checkpoint (PyTorch), an exported ONNX model (ONNX Runtime) or an
    AOTInductor package (`torch._inductor.aoti_load_package`).

    Args:
        ckpt_path: Checkpoint written by `fit` (needs `configs`); or None with `onnx_path` or `aoti_path`.
        configs: The training run's config files (default: its saved config.yaml).
        overrides: --model.* / --data.* flags for the config parser.
        onnx_path: An ONNX file written by `export` or `quantize` (its model.json beside it).
        aoti_path: An AOTInductor package written by `export --format aoti` (its model.json beside it).
        max_batch_size: Most requests classified in one forward pass (dynamic batching).
        batch_timeout: Seconds to wait for a batch to fill before running what has arrived.
        max_image_pixels: Largest accepted width x height of an upload (decompression-bomb guard).
        threads: CPU threads per worker (default: torch's / ONNX Runtime's default).
        top_k: Also answer the `top_k` most likely classes when above 1 (single-label models; a multi-label
            answer has every tag's probability).
    """

    def __init__(
        self,
        ckpt_path: str | None = None,
        configs: list[str] | None = None,
        overrides: list[str] | None = None,
        onnx_path: str | None = None,
        aoti_path: str | None = None,
        max_batch_size: int = 16,
        batch_timeout: float = 0.01,
        max_image_pixels: int = 40_000_000,
        threads: int | None = None,
        top_k: int = 1,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict")
        self.ckpt_path, self.configs, self.overrides = ckpt_path, configs, overrides
        self.exported_path = onnx_path or aoti_path
        self.max_image_pixels = max_image_pixels
        self.threads = threads
        self.top_k = top_k

    # -- runs once per inference worker -------------------------------------------------------------------
    def setup(self, device: str) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        self.device = device
        if self.exported_path:
            meta, self.pre = read_metadata(self.exported_path)
            self.decoder: Decoder = decoder_for(meta.get("task"), self.pre.class_names)
            self.runtime = exported_runtime(self.exported_path, threads=self.threads)
            self.net = None
        else:
            from project.export.trained import load_trained

            if self.ckpt_path is None:
                raise UserError(
                    "ClassifierAPI needs ckpt_path (a checkpoint), onnx_path or aoti_path (an exported model)"
                )
            trained = load_trained(self.ckpt_path, self.configs, self.overrides)
            self.pre: Preprocessing = trained.preprocessing
            self.decoder = decoder_for(trained.outputs, self.pre.class_names)
            self.net = trained.net.to(device).eval()
        self.mean = torch.tensor(self.pre.mean, device=device)
        self.std = torch.tensor(self.pre.std, device=device)

    # -- per request ----------------------------------------------------------------------------------------
    def decode_request(self, request: UploadedFile) -> torch.Tensor | Rejected:
        """Upload bytes -> (C, H, W) at the model's input size (`Preprocessing.decode`), or a `Rejected` saying
        why not.

        Never raises: whatever is wrong with one upload is answered for that upload alone, and the other
        requests batched with it are classified as usual.
        """
        if not request:
            return Rejected(400, "the form field 'file' is empty")
        try:
            open_image(io.BytesIO(request), self.max_image_pixels).close()  # the header only: format and size
        except UnidentifiedImageError:
            return Rejected(415, "the upload is not an image PIL can read (send a JPEG, PNG, ... file)")
        except ImageTooLarge as e:
            return Rejected(413, str(e))
        except Exception as e:  # any other unreadable header
            return Rejected(400, f"cannot read the image: {e or type(e).__name__}")
        try:
            return self.pre.decode(request, self.max_image_pixels)
        except Exception as e:  # truncated or corrupt after a valid header
            return Rejected(400, f"cannot decode the image: {e or type(e).__name__}")

    def batch(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)  # kept as a list: rejected uploads must not reach the model

    def predict(self, x: Any) -> Any:
        single = not isinstance(x, list)  # max_batch_size 1: LitServe passes one decoded request
        items = [x] if single else x
        valid = [i for i, item in enumerate(items) if isinstance(item, torch.Tensor)]
        outputs: list[Any] = list(items)
        if valid:
            images = torch.stack([items[i] for i in valid])
            probs = self._probabilities(images)
            for row, i in enumerate(valid):
                outputs[i] = probs[row]
        return outputs[0] if single else outputs

    def _probabilities(self, images: torch.Tensor) -> np.ndarray:
        if self.net is not None:
            x = (images.to(self.device).float() / 255.0 - self.mean.view(1, -1, 1, 1)) / self.std.view(
                1, -1, 1, 1
            )
            with torch.inference_mode():
                return self.decoder.probabilities(self.net(x)).cpu().numpy()
        return self.decoder.probabilities(self.runtime(self.pre.normalize(images).numpy()))

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, Rejected):
            return JSONResponse(status_code=output.status, content={"detail": output.detail})
        return self.decoder.answer(output, self.top_k)
