"""From checkpoint to deployment: export (ONNX, AOTInductor, TorchScript), INT8 quantization report, batch
inference from an export.

The tool commands export, quantize and predict_onnx live here (COMMANDS); `serve` is in the serve package.
"""

from project.export.preprocessing import Preprocessing, read_metadata
from project.export.trained import TrainedModel, load_trained

__all__ = ["Preprocessing", "TrainedModel", "load_trained", "read_metadata"]

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "commands": {
        "export": (".model_export:main", "export a checkpoint to ONNX, AOTInductor and/or TorchScript"),
        "quantize": (".quantize:main", "INT8 quantization report: accuracy, latency, size"),
        "predict_onnx": (".predict_onnx:main", "batched inference from an ONNX model or AOTInductor package"),
    }
}
