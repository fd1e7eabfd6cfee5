"""From checkpoint to deployment: export (ONNX, TorchScript), INT8 quantization report, ONNX batch inference.

The tool commands `python -m project export|quantize|predict_onnx` live here; `serve` is in project.serve.
"""

from project.export.preprocessing import Preprocessing, read_metadata
from project.export.trained import TrainedModel, load_trained

__all__ = ["Preprocessing", "TrainedModel", "load_trained", "read_metadata"]
