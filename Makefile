# Two commands for a newcomer:  `make run` (demo agent on :8000) and `make test` (whole suite).
# While working, `make check` is the fast loop: lint, types and the unit tests in under 2 minutes
# on 2 cores. `make test` stays the whole suite, as CI runs it (.ci/run).
PYTHON ?= python3
VENV ?= .venv
PERF_VENV ?= .venv-perf
KSERVE_VENV ?= .venv-kserve
TRITON_VENV ?= .venv-triton
TRITON_VERSION ?= 0.7.0
KSERVE_VERSION ?= 0.21.0
BIN := $(VENV)/bin

.PHONY: run test check fuzz lint typecheck unit perf-analyzer kserve-sdk triton systemd-tools mosquitto chromium rabbitmq fuse lint-ansible bench powercut proto clean demo fleet-10k fleet-cluster

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && \
	    rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); \
	  else echo "python3 -m venv failed: install it with 'sudo apt-get install python3-venv'"; exit 1; fi; }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/edge-agent serve --demo

test: $(BIN)/.installed perf-analyzer kserve-sdk systemd-tools lint lint-ansible typecheck unit

# The fast tier: every test not marked e2e (a whole agent, the program as a process, worker
# processes), bench (benchmarks, perf_analyzer) or external (brokers, chromium, Ansible, systemd
# tools, KServe's SDK, a GPU); tests/conftest.py says which tests are which. Needs only .venv.
# About 95 s of CPU in all (measured on the shared 2-core machine), the tests on CHECK_WORKERS
# pytest-xdist workers: about a minute of wall time on 2 quiet cores.
CHECK_WORKERS ?= 2
check: lint typecheck
	$(BIN)/pytest -n $(CHECK_WORKERS) -m "not e2e and not bench and not external"

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the layering contract in pyproject.toml

typecheck: $(BIN)/.installed
	$(BIN)/mypy

unit: $(BIN)/.installed mosquitto chromium rabbitmq fuse triton
	PERF_ANALYZER=$(CURDIR)/$(PERF_VENV)/bin/perf_analyzer \
	  KSERVE_PYTHON=$(CURDIR)/$(KSERVE_VENV)/bin/python $(BIN)/pytest

# Schemathesis against the HTTP API (docs/api.md#fuzzing-the-http-api): a longer, random run
# than the 10 examples per operation of `make test`.
EDGE_AGENT_FUZZ_EXAMPLES ?= 200
fuzz: $(BIN)/.installed
	EDGE_AGENT_FUZZ_EXAMPLES=$(EDGE_AGENT_FUZZ_EXAMPLES) $(BIN)/pytest tests/agent/api/test_http_fuzz.py -p no:logging

# Triton's load generator (Debian 12). Best effort: without it the perf_analyzer test skips
# and says why.
perf-analyzer:
	@[ -x $(PERF_VENV)/bin/perf_analyzer ] || bash bench/install-perf-analyzer.sh $(PERF_VENV) \
	  || echo "perf_analyzer could not be installed; tests that need it will skip"

# KServe's Python SDK (the Open Inference Protocol's reference client) for tests/agent/api/test_kserve_sdk.py,
# in a venv of its own: its pins (psutil<6 ...) conflict with the agent's. Best effort: without it
# that test skips and says why.
kserve-sdk:
	@$(KSERVE_VENV)/bin/python -c 'import kserve' 2>/dev/null || { \
	  $(PYTHON) -m venv $(KSERVE_VENV) && $(KSERVE_VENV)/bin/pip install -q 'kserve==$(KSERVE_VERSION)'; } \
	  || echo "KServe's SDK could not be installed; tests/agent/api/test_kserve_sdk.py will skip"

# The real tritonserver (2.51.0, from the nvidia-pytriton wheel) for tests/conformance, the
# differential suite, in a venv of its own: a test dependency only, nothing of it ships. Its Python
# backend stub embeds Debian's libpython3.11 and needs numpy < 2 there (python3-numpy). Best
# effort: without it those tests skip and say why.
triton:
	@ls $(TRITON_VENV)/lib/python3*/site-packages/pytriton/tritonserver/bin/tritonserver >/dev/null 2>&1 || { \
	  $(PYTHON) -m venv $(TRITON_VENV) && $(TRITON_VENV)/bin/pip install -q 'nvidia-pytriton==$(TRITON_VERSION)'; } \
	  || echo "tritonserver could not be installed; tests/conformance will skip"
	@/usr/bin/python3 -c 'import numpy' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-numpy >/dev/null; } \
	      || echo "python3-numpy could not be installed; tests/conformance will skip"; \
	  else echo "python3-numpy missing: sudo apt-get install python3-numpy (tests/conformance will skip)"; fi; }

# systemd-analyze / systemd-sysusers for tests/deploy (Debian's "systemd" package; no running
# systemd needed).
systemd-tools:
	@command -v systemd-analyze >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends systemd >/dev/null; \
	  else echo "systemd-analyze missing (sudo apt-get install systemd); tests/deploy unit checks will skip"; fi; }

# tests/agent/fleet, manager and wire run a real broker (Debian's mosquitto); without it those tests skip and say why.
mosquitto:
	@command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null; \
	  else echo "mosquitto missing: sudo apt-get install mosquitto (MQTT tests will skip)"; fi; }

# tests/agent/pages and the dashboard test drive Debian's headless chromium through selenium; without
# it they skip and say why.
chromium:
	@{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium chromium-driver >/dev/null || echo "chromium could not be installed; browser tests will skip"; \
	  else echo "chromium missing: sudo apt-get install chromium chromium-driver (browser tests will skip)"; fi; }

# FUSE for tests/powercut (the power-cut file system: Debian's fuse3 for fusermount3, libfuse3-3
# for mfusepy); best effort: without it those tests skip and say why.
fuse:
	@{ command -v fusermount3 >/dev/null && ldconfig -p | grep -q 'libfuse3\.so\.3'; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-3 >/dev/null \
	      || echo "fuse3 could not be installed; tests/powercut will skip"; \
	  else echo "FUSE missing: sudo apt-get install fuse3 libfuse3-3 (tests/powercut will skip)"; fi; }

# Power cuts at >= 10,000 durable points of the cache, sync, outbox and rollout stores, each
# followed by a reboot and the stores' invariants (bench/powercut.md has the figures).
POWERCUT_CUTS ?= 10000
powercut: $(BIN)/.installed fuse
	$(BIN)/python -m tests.powercut.campaign --cuts $(POWERCUT_CUTS)

# RabbitMQ's MQTT plugin (MQTT 3.1.1) for the fleet tests' second broker; best effort (the
# fixture starts its own node; without it those tests skip and say why).
rabbitmq:
	@[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null \
	      || echo "rabbitmq-server could not be installed; its fleet tests will skip"; \
	  else echo "rabbitmq-server missing: sudo apt-get install rabbitmq-server (its fleet tests will skip)"; fi; }

# The whole product on one machine: S3-protocol store, broker, publisher, three agents, a
# rollout in waves and a bad version rolled back (bench/fleet_demo.py says what each step shows).
demo: $(BIN)/.installed mosquitto
	$(BIN)/python -m bench.fleet_demo

# 10,000 simulated devices on a real Mosquitto: inventory, two exporters, the dashboard, a
# rollout in waves and one aborted by 5 % regressing devices; figures and checks
# (bench/fleet10k.md). Not in `make test`, which runs the same with 300 devices.
FLEET_DEVICES ?= 10000
fleet-10k: $(BIN)/.installed mosquitto chromium
	$(BIN)/python -m bench.fleet10k --devices $(FLEET_DEVICES)

# Past one broker: RabbitMQ's MQTT plugin as a 3-node cluster on this machine, devices spread
# over the nodes, one node stopped mid-rollout (bench/fleet10k.md, docs/mqtt.md#sizing).
CLUSTER_DEVICES ?= 2000
fleet-cluster: $(BIN)/.installed rabbitmq
	$(BIN)/python -m bench.fleet_cluster --devices $(CLUSTER_DEVICES)

lint-ansible: $(BIN)/.installed
	cd deploy/ansible && PATH=$(CURDIR)/$(BIN):$$PATH $(CURDIR)/$(BIN)/ansible-lint --offline --profile production

# The suite (raw ONNX Runtime against the agent), then the agent against the real Triton on the
# same models (bench/triton_compare.py). BENCH_ARGS=--quick: the short smoke run of both.
BENCH_ARGS ?=
bench: $(BIN)/.installed perf-analyzer triton
	PERF_ANALYZER=$(CURDIR)/$(PERF_VENV)/bin/perf_analyzer $(BIN)/python -m bench $(BENCH_ARGS)
	PERF_ANALYZER=$(CURDIR)/$(PERF_VENV)/bin/perf_analyzer TRITON_VENV=$(CURDIR)/$(TRITON_VENV) \
	  $(BIN)/python -m bench.triton_compare $(BENCH_ARGS)

# Regenerate the Python code for the ModelConfig schema after editing the .proto.
proto: $(BIN)/.installed
	$(BIN)/python -m grpc_tools.protoc -I agent/proto --python_out=agent/proto \
	  --pyi_out=agent/proto --grpc_python_out=agent/proto \
	  agent/proto/model_config.proto agent/proto/grpc_service.proto
	$(BIN)/python -m grpc_tools.protoc -I agent/proto --python_out=agent/proto \
	  --pyi_out=agent/proto agent/proto/onnx_model.proto
	rm -f agent/proto/model_config_pb2_grpc.py
	$(BIN)/python agent/proto/fix_generated.py agent/proto/*_pb2.py agent/proto/*_pb2_grpc.py

clean:
	rm -rf $(VENV) $(PERF_VENV) $(KSERVE_VENV) $(TRITON_VENV) .mypy_cache .ruff_cache .pytest_cache
