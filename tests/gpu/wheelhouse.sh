#!/usr/bin/env bash
# Build the wheelhouse run_gpu_checks.sh installs from on a GPU machine without network:
#   bash tests/gpu/wheelhouse.sh [PYTHON_VERSION=3.12] [PLATFORM=manylinux_2_28_x86_64]
# Leaves out what that machine already has (numpy, onnxruntime, cuda-bindings, nvidia-ml-py,
# cupy) and prints the size: what is carried to the machine must stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${1:-3.12}
PLATFORM=${2:-manylinux_2_28_x86_64}
OUT=${WHEELS:-.whl/gpu}
mkdir -p "$OUT"
# The project's own dependencies, from pyproject.toml (the project travels as source).
mapfile -t DEPS < <(python3 -c 'import tomllib
for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]: print(d)')
python3 -m pip download -q -d "$OUT" --only-binary=:all: --python-version "$PYVER" \
  --platform "$PLATFORM" --platform manylinux2014_x86_64 --platform any \
  "setuptools>=68" "${DEPS[@]}" 'tritonclient[http,grpc]' pytest pytest-timeout
rm -f "$OUT"/numpy-* "$OUT"/onnxruntime-* "$OUT"/cuda_* "$OUT"/nvidia_* "$OUT"/cupy*
du -sh "$OUT"
