"""Model compression: progressive pruning, quantization-aware training and INT8 conversion.

The callbacks (`ProgressivePruning`, `QuantizationAwareTraining`) and the export tools (`quantize`) share
the INT8 machinery here: torchao's PT2E flow (`pt2e`, `int8_program`) and ONNX Runtime's quantization
(`onnx_int8`). Delete this folder, `configs/callbacks/{pruning,pruning_channels,qat}.yaml` and
`project/export/quantize.py` if you need none of it.
"""
