#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU:
#   bash tests/gpu/run_gpu_checks.sh            # LIMIT_S=240 by default
#
# What runs (each part skips with the reason where what it needs is missing, see conftest.py):
#   test_nvml_metrics.py        NVML figures on a running agent's /metrics and in the doctor (nvidia-ml-py)
#   test_cuda_shared_memory.py  tritonclient CUDA shared memory over HTTP and gRPC (cuda-python)
#   test_tensorrt.py            engine builds and serving (tensorrt; not installable offline)
#
# The machine may have no network: a virtualenv that sees the system's packages (cuda-bindings,
# nvidia-ml-py, onnxruntime, numpy already there) gets the wheels in $WHEELS when that folder
# exists (made where the network is, with tests/gpu/wheelhouse.sh; installed without resolving,
# so nothing is fetched) and the project runs from this checkout (PYTHONPATH); without the
# folder the project is installed from the configured index. The checks run under
# `timeout $LIMIT_S` so that a hung one still leaves device time for a second run.
set -euo pipefail
cd "$(dirname "$0")/../.."
LIMIT_S=${LIMIT_S:-240}
WHEELS=${WHEELS:-.whl/gpu}
VENV=${VENV:-.venv-gpu}
started=$(date +%s)

nvidia-smi --query-gpu=name,uuid,memory.total,power.limit,driver_version --format=csv || true
[ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
PY="$VENV/bin/python"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$WHEELS" ]; then
  "$PY" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl
else
  "$PY" -m pip install -q -e . 'tritonclient[http,grpc]' pytest pytest-timeout \
    || echo "pip install failed (offline?): running with what is installed"
fi
"$PY" - <<'PY'
import importlib
for name in ("agent", "tritonclient.http", "tritonclient.grpc", "cuda.bindings.runtime",
             "pynvml", "cupy", "onnxruntime", "tensorrt"):
    try:
        module = importlib.import_module(name)
        print(f"{name}: {getattr(module, '__version__', 'ok')}")
    except Exception as exc:  # report every missing part, the tests say which ones skip
        print(f"{name}: MISSING ({exc})")
PY
echo "setup took $(( $(date +%s) - started )) s; checks limited to ${LIMIT_S} s"
# Without a model cache or fleet link the agent needs no state outside the temp dirs.
exec timeout --signal=INT --kill-after=20 "$LIMIT_S" \
  "$PY" -m pytest tests/gpu -v -rs -s -p no:cacheprovider --timeout 120
