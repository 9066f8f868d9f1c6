#!/usr/bin/env bash
# Build the wheelhouse run_gpu_checks.sh installs from on a GPU machine without network:
#   bash tests/gpu/wheelhouse.sh [PYTHON_VERSION=3.12] [PLATFORM=manylinux_2_28_x86_64]
# Leaves out what that machine already has (numpy, onnxruntime, cuda-bindings, nvidia-ml-py,
# cupy) and what the checks never import, and prints the size: what is carried to the machine
# must stay under 64 MiB (carry it: run --carry .whl/gpu).
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
# What the GPU checks never import (S3 sync, model signing, OpenTelemetry, uvloop, the installer
# itself): about 33 MiB of the 70 that `pip download` brings; the rest is about 37 MiB.
for name in boto3 botocore s3transfer jmespath pip setuptools uvloop model_signing sigstore \
    sigstore_models sigstore_rekor_types rfc3161_client pydantic pydantic_core annotated_types \
    typing_inspection opentelemetry_api opentelemetry_exporter_http_transport \
    opentelemetry_exporter_otlp_common opentelemetry_exporter_otlp_proto_common \
    opentelemetry_exporter_otlp_proto_http opentelemetry_proto opentelemetry_sdk \
    opentelemetry_semantic_conventions googleapis_common_protos rich markdown_it_py mdurl \
    in_toto_attestation id rfc8785 email_validator dnspython pyjwt pyopenssl blake3 tuf \
    securesystemslib asn1crypto platformdirs; do
  rm -f "$OUT/$name"-[0-9]*.whl
done
du -sh "$OUT"
