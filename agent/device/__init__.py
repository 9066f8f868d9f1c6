"""What this device has: Jetson release, CPU, memory, GPU, CUDA, TensorRT and ONNX Runtime.

`tegra` and `checks` are pure (parsers and judgements over plain data); `facts` reads the device.
"""
