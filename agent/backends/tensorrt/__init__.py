"""The TensorRT backend: serialized engines, their on-device build from ONNX, and the config
completed from an engine."""
