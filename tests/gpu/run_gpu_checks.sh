#!/usr/bin/env bash
# GPU checks for TensorRT engines, run once on a machine with an NVIDIA GPU:
#   bash tests/gpu/run_gpu_checks.sh
# Installs what the checks need from wheels into the project's virtualenv, then runs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || { python3 -m venv .venv; PY=.venv/bin/python; }
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv || true
"$PY" -m pip install -q -e '.[dev]' scikit-learn
"$PY" -m pip install -q 'tensorrt>=10' 'cuda-python>=12'
"$PY" -c 'import tensorrt, sys; print("tensorrt", tensorrt.__version__)'
exec "$PY" -m pytest tests/gpu -v -rs -s -p no:cacheprovider
