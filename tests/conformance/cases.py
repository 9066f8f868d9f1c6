"""The corpus: requests sent to both servers, by area, as data (tests/conformance/compare.py).

Cases run in the order given, on one pair of servers per module: a case may rely on what the
cases before it did (a load before an infer), never on what runs after it.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import replace

from tests.conformance.compare import JSON, Case, Grpc, Http
from tests.conformance.repository import DATATYPES, MODELS

GOOD_MODELS = (
    "all_types", "add_sub", "identity", "errors", "params", "bls", "repeat", "accumulate",
    "custom_metrics", "versioned", "spare", "ensemble_add_sub",
)  # fmt: skip
BAD_MODELS = ("init_fails", "bad_dims", "bad_datatype", "neg_batch", "wrong_name")
UNKNOWN = "no_such_model"
STAT_VOLATILE = ("ns", "last_inference", "memory_usage")

# Two values per datatype (JSON form) and their little-endian bytes (binary form).
VALUES: dict[str, list[JSON]] = {
    "BOOL": [True, False], "UINT8": [0, 255], "UINT16": [1, 65535], "UINT32": [2, 4294967295],
    "UINT64": [3, 18446744073709551615], "INT8": [-128, 127], "INT16": [-32768, 32767],
    "INT32": [-2147483648, 2147483647], "INT64": [-9223372036854775808, 9223372036854775807],
    "FP16": [1.5, -2.0], "FP32": [0.25, -1.5], "FP64": [1e300, -0.125], "BYTES": ["a", "hello"],
}  # fmt: skip
PACK = {
    "BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b",
    "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d",
}  # fmt: skip


def raw(datatype: str) -> bytes:
    values = VALUES[datatype]
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(str(v))) + str(v).encode() for v in values)
    return struct.pack(f"<{len(values)}{PACK[datatype]}", *values)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def infer(model: str, body: object, *, version: str = "", binary: tuple[bytes, ...] = ()) -> Http:
    where = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return Http("POST", where, body, binary=binary)


def grpc_infer(model: str, inputs: list[JSON], **extra: object) -> Grpc:
    return Grpc("ModelInfer", {"model_name": model, "inputs": inputs, **extra})


def fp32_inputs(a: list[float], b: list[float]) -> list[JSON]:
    return [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": a},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": b},
    ]


A = [1.0, 2.0, 3.0, 4.0]
B = [0.5, 0.5, 0.5, 0.5]


def grpc_fp32(a: list[float], b: list[float], shape: tuple[int, ...] = (1, 4)) -> list[JSON]:
    return [
        {"name": n, "datatype": "FP32", "shape": list(shape), "contents": {"fp32_contents": v}}
        for n, v in (("INPUT0", a), ("INPUT1", b))
    ]


def health() -> list[Case]:
    cases = [
        Case("http-live", "health", Http("GET", "/v2/health/live")),
        Case("http-ready", "health", Http("GET", "/v2/health/ready")),
        Case("http-metadata", "health", Http("GET", "/v2"), ignore=("version", "extensions")),
        Case("grpc-live", "health", Grpc("ServerLive")),
        Case("grpc-ready", "health", Grpc("ServerReady")),
        Case("grpc-metadata", "health", Grpc("ServerMetadata"), ignore=("version", "extensions")),
        Case("http-unknown-path", "health", Http("GET", "/v2/nothing/here")),
        Case("http-post-live", "health", Http("POST", "/v2/health/live")),
    ]
    return cases


def metadata() -> list[Case]:
    cases: list[Case] = []
    for model in (*GOOD_MODELS, *BAD_MODELS, UNKNOWN):
        cases.append(Case(f"http-meta-{model}", "metadata", Http("GET", f"/v2/models/{model}")))
        cases.append(Case(f"grpc-meta-{model}", "metadata", Grpc("ModelMetadata", {"name": model})))
    for version in ("1", "2", "3", "9", "x"):
        path = f"/v2/models/versioned/versions/{version}"
        cases.append(Case(f"http-meta-versioned-v{version}", "metadata", Http("GET", path)))
        request = {"name": "versioned", "version": version}
        cases.append(
            Case(f"grpc-meta-versioned-v{version}", "metadata", Grpc("ModelMetadata", request))
        )
    return cases


def config() -> list[Case]:
    cases: list[Case] = []
    for model in (*GOOD_MODELS, *BAD_MODELS, UNKNOWN):
        path = f"/v2/models/{model}/config"
        cases.append(Case(f"http-config-{model}", "config", Http("GET", path)))
        cases.append(Case(f"grpc-config-{model}", "config", Grpc("ModelConfig", {"name": model})))
    cases.append(
        Case(
            "http-config-versioned-v1",
            "config",
            Http("GET", "/v2/models/versioned/versions/1/config"),
        )
    )
    return cases


def readiness() -> list[Case]:
    cases: list[Case] = []
    for model in (*GOOD_MODELS, *BAD_MODELS, UNKNOWN):
        path = f"/v2/models/{model}/ready"
        cases.append(Case(f"http-ready-{model}", "readiness", Http("GET", path)))
        cases.append(Case(f"grpc-ready-{model}", "readiness", Grpc("ModelReady", {"name": model})))
    for version in ("1", "2", "3", "9"):
        path = f"/v2/models/versioned/versions/{version}/ready"
        cases.append(Case(f"http-ready-versioned-v{version}", "readiness", Http("GET", path)))
        request = {"name": "versioned", "version": version}
        cases.append(
            Case(f"grpc-ready-versioned-v{version}", "readiness", Grpc("ModelReady", request))
        )
    return cases


def index() -> list[Case]:
    cases = []
    for label, body in (("empty", {}), ("ready", {"ready": True}), ("all", {"ready": False})):
        cases.append(
            Case(
                f"http-index-{label}",
                "index",
                Http("POST", "/v2/repository/index", body),
                sort_key="name",
            )
        )
        cases.append(
            Case(f"grpc-index-{label}", "index", Grpc("RepositoryIndex", body), sort_key="name")
        )
    cases.append(Case("http-index-nobody", "index", Http("POST", "/v2/repository/index")))
    return cases


def datatypes() -> list[Case]:
    cases: list[Case] = []
    for dt in DATATYPES:
        values = VALUES[dt]
        tensor = {"name": f"IN_{dt}", "datatype": dt, "shape": [len(values)], "data": values}
        cases.append(Case(f"http-json-{dt}", "inference", infer("all_types", {"inputs": [tensor]})))
        binary_in = {
            "name": f"IN_{dt}",
            "datatype": dt,
            "shape": [len(values)],
            "parameters": {"binary_data_size": len(raw(dt))},
        }
        body = {
            "inputs": [binary_in],
            "outputs": [{"name": f"OUT_{dt}", "parameters": {"binary_data": True}}],
        }
        cases.append(
            Case(f"http-binary-{dt}", "inference", infer("all_types", body, binary=(raw(dt),)))
        )
        body = {"inputs": [binary_in]}
        cases.append(
            Case(
                f"http-binary-in-json-out-{dt}",
                "inference",
                infer("all_types", body, binary=(raw(dt),)),
            )
        )
        grpc_tensor = {"name": f"IN_{dt}", "datatype": dt, "shape": [len(values)]}
        cases.append(
            Case(
                f"grpc-raw-{dt}",
                "inference",
                grpc_infer("all_types", [grpc_tensor], raw_input_contents=[b64(raw(dt))]),
            )
        )
        wrong = "FP32" if dt != "FP32" else "INT32"
        bad = {"name": f"IN_{dt}", "datatype": wrong, "shape": [1], "data": [1]}
        cases.append(
            Case(f"http-wrong-datatype-{dt}", "inference", infer("all_types", {"inputs": [bad]}))
        )
    both = [
        {"name": "IN_INT32", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        {"name": "IN_BYTES", "datatype": "BYTES", "shape": [1], "data": ["x"]},
    ]
    cases.append(Case("http-optional-two", "inference", infer("all_types", {"inputs": both})))
    cases.append(Case("http-optional-none", "inference", infer("all_types", {"inputs": []})))
    cases.append(Case("grpc-optional-none", "inference", grpc_infer("all_types", [])))
    return cases


def inference() -> list[Case]:
    body = {"inputs": fp32_inputs(A, B)}
    cases = [
        Case("http-add-sub", "inference", infer("add_sub", body)),
        Case("http-add-sub-id", "inference", infer("add_sub", {**body, "id": "req-7"})),
        Case("http-add-sub-version", "inference", infer("add_sub", body, version="1")),
        Case("http-add-sub-bad-version", "inference", infer("add_sub", body, version="4")),
        Case(
            "http-output-order",
            "inference",
            infer("add_sub", {**body, "outputs": [{"name": "OUTPUT1"}, {"name": "OUTPUT0"}]}),
        ),
        Case(
            "http-one-output",
            "inference",
            infer("add_sub", {**body, "outputs": [{"name": "OUTPUT1"}]}),
        ),
        Case(
            "http-unknown-output",
            "inference",
            infer("add_sub", {**body, "outputs": [{"name": "NOPE"}]}),
        ),
        Case(
            "http-classification",
            "inference",
            infer(
                "add_sub",
                {**body, "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]},
            ),
        ),
        Case(
            "http-classification-nolabels",
            "inference",
            infer(
                "add_sub",
                {**body, "outputs": [{"name": "OUTPUT1", "parameters": {"classification": 3}}]},
            ),
        ),
        Case(
            "http-binary-output",
            "inference",
            infer(
                "add_sub",
                {**body, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
            ),
        ),
        Case(
            "http-binary-all-outputs",
            "inference",
            infer("add_sub", {**body, "parameters": {"binary_data_output": True}}),
        ),
        Case(
            "http-missing-input", "inference", infer("add_sub", {"inputs": fp32_inputs(A, B)[:1]})
        ),
        Case(
            "http-extra-input",
            "inference",
            infer(
                "add_sub",
                {
                    "inputs": [
                        *fp32_inputs(A, B),
                        {"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1]},
                    ]
                },
            ),
        ),
        Case(
            "http-wrong-shape",
            "inference",
            infer(
                "add_sub",
                {
                    "inputs": [
                        {**fp32_inputs(A, B)[0], "shape": [1, 3], "data": [1, 2, 3]},
                        fp32_inputs(A, B)[1],
                    ]
                },
            ),
        ),
        Case(
            "http-data-count",
            "inference",
            infer(
                "add_sub",
                {"inputs": [{**fp32_inputs(A, B)[0], "data": [1, 2]}, fp32_inputs(A, B)[1]]},
            ),
        ),
        Case(
            "http-batch-too-big",
            "inference",
            infer(
                "add_sub",
                {
                    "inputs": [
                        {**i, "shape": [9, 4], "data": i["data"] * 9} for i in fp32_inputs(A, B)
                    ]
                },
            ),
        ),
        Case("http-unknown-model", "inference", infer(UNKNOWN, body)),
        Case("http-not-ready-model", "inference", infer("init_fails", body)),
        Case("http-no-inputs-key", "inference", infer("add_sub", {})),
        Case(
            "http-bad-datatype-name",
            "inference",
            infer(
                "add_sub",
                {"inputs": [{**fp32_inputs(A, B)[0], "datatype": "FLOAT"}, fp32_inputs(A, B)[1]]},
            ),
        ),
        Case(
            "http-malformed-json",
            "inference",
            Http(
                "POST",
                "/v2/models/add_sub/infer",
                raw=b'{"inputs": [',
                headers={"Content-Type": "application/json"},
            ),
            deviation="malformed JSON is the client's error: 400 (Triton: 500)",
            triton_status=400,
            agent_status=400,
        ),
        Case("grpc-add-sub", "inference", grpc_infer("add_sub", grpc_fp32(A, B))),
        Case(
            "grpc-add-sub-outputs",
            "inference",
            grpc_infer(
                "add_sub", grpc_fp32(A, B), outputs=[{"name": "OUTPUT1"}, {"name": "OUTPUT0"}]
            ),
        ),
        Case("grpc-add-sub-id", "inference", grpc_infer("add_sub", grpc_fp32(A, B), id="g-1")),
        Case("grpc-unknown-model", "inference", grpc_infer(UNKNOWN, grpc_fp32(A, B))),
        Case("grpc-missing-input", "inference", grpc_infer("add_sub", grpc_fp32(A, B)[:1])),
        Case(
            "grpc-wrong-shape", "inference", grpc_infer("add_sub", grpc_fp32(A[:3], B[:3], (1, 3)))
        ),
        Case(
            "grpc-classification",
            "inference",
            grpc_infer(
                "add_sub",
                grpc_fp32(A, B),
                outputs=[{"name": "OUTPUT0", "parameters": {"classification": {"int64_param": 2}}}],
            ),
        ),
        Case("grpc-not-ready-model", "inference", grpc_infer("init_fails", grpc_fp32(A, B))),
    ]
    return cases


def model_errors() -> list[Case]:
    cases: list[Case] = []
    for code in (0, *range(10, 18), *range(20, 28), 30, 31, 32):
        tensor = {"name": "CODE", "datatype": "INT32", "shape": [1], "data": [code]}
        cases.append(
            Case(f"http-model-error-{code}", "model-errors", infer("errors", {"inputs": [tensor]}))
        )
        grpc_tensor = {
            **{k: v for k, v in tensor.items() if k != "data"},
            "contents": {"int_contents": [code]},
        }
        cases.append(
            Case(f"grpc-model-error-{code}", "model-errors", grpc_infer("errors", [grpc_tensor]))
        )
    return cases


def parameters() -> list[Case]:
    x = {"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}
    gx = {"name": "X", "datatype": "INT32", "shape": [1], "contents": {"int_contents": [1]}}
    cases = [
        Case("http-params-none", "parameters", infer("params", {"inputs": [x]})),
        Case("http-params-id", "parameters", infer("params", {"id": "abc", "inputs": [x]})),
        Case(
            "http-params-values",
            "parameters",
            infer(
                "params", {"id": "p", "parameters": {"s": "v", "i": 3, "b": False}, "inputs": [x]}
            ),
        ),
        Case(
            "http-params-binary-out",
            "parameters",
            infer("params", {"parameters": {"binary_data_output": True}, "inputs": [x]}),
        ),
        Case("grpc-params-none", "parameters", grpc_infer("params", [gx])),
        Case(
            "grpc-params-values",
            "parameters",
            grpc_infer(
                "params",
                [gx],
                id="q",
                parameters={
                    "s": {"string_param": "v"},
                    "i": {"int64_param": 3},
                    "b": {"bool_param": True},
                },
            ),
        ),
    ]
    return cases


def bls_ensemble() -> list[Case]:
    body = {"inputs": fp32_inputs(A, B)}
    ens = {"inputs": [{**i, "name": n} for i, n in zip(fp32_inputs(A, B), ("A", "B"), strict=True)]}
    bad = {"inputs": fp32_inputs([-1.0, 0, 0, 0], B)}
    return [
        Case("http-bls", "bls", infer("bls", body)),
        Case("http-bls-missing-model", "bls", infer("bls", bad)),
        Case("grpc-bls", "bls", grpc_infer("bls", grpc_fp32(A, B))),
        Case("http-ensemble", "ensemble", infer("ensemble_add_sub", ens)),
        Case(
            "http-ensemble-one-output",
            "ensemble",
            infer("ensemble_add_sub", {**ens, "outputs": [{"name": "DIFF"}]}),
        ),
        Case(
            "http-ensemble-missing-input",
            "ensemble",
            infer("ensemble_add_sub", {"inputs": ens["inputs"][:1]}),
        ),
        Case(
            "grpc-ensemble",
            "ensemble",
            grpc_infer(
                "ensemble_add_sub",
                [{**i, "name": n} for i, n in zip(grpc_fp32(A, B), ("A", "B"), strict=True)],
            ),
        ),
    ]


def decoupled_sequence() -> list[Case]:
    values = {
        "name": "IN",
        "datatype": "INT32",
        "shape": [3],
        "contents": {"int_contents": [4, 5, 6]},
    }
    stream = {"model_name": "repeat", "id": "r", "inputs": [values]}
    cases = [
        Case(
            "http-decoupled-infer",
            "decoupled",
            infer(
                "repeat",
                {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}]},
            ),
        ),
        Case("grpc-decoupled-unary", "decoupled", Grpc("ModelInfer", stream)),
        Case("grpc-decoupled-stream", "decoupled", Grpc("ModelStreamInfer", stream=[stream])),
        Case(
            "grpc-decoupled-stream-empty",
            "decoupled",
            Grpc(
                "ModelStreamInfer",
                stream=[{**stream, "inputs": [{**values, "shape": [0], "contents": {}}]}],
            ),
        ),
    ]

    def seq(step: int, value: int, corr: int, **flags: bool) -> Http:
        params: JSON = {"sequence_id": corr, **{f"sequence_{k}": v for k, v in flags.items()}}
        x = {"name": "INPUT", "datatype": "INT32", "shape": [1], "data": [value]}
        return infer("accumulate", {"parameters": params, "inputs": [x]})

    cases += [
        Case("http-seq-start", "sequence", seq(0, 3, 1001, start=True)),
        Case("http-seq-mid", "sequence", seq(1, 4, 1001)),
        Case("http-seq-end", "sequence", seq(2, 5, 1001, end=True)),
        Case(
            "http-seq-no-id",
            "sequence",
            infer(
                "accumulate",
                {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1], "data": [1]}]},
            ),
        ),
        Case("http-seq-not-started", "sequence", seq(0, 1, 1002)),
        Case(
            "http-seq-string-id-start",
            "sequence",
            Http(
                "POST",
                "/v2/models/accumulate/infer",
                {
                    "parameters": {"sequence_id": "abc", "sequence_start": True},
                    "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1], "data": [7]}],
                },
            ),
        ),
    ]
    g = {"name": "INPUT", "datatype": "INT32", "shape": [1], "contents": {"int_contents": [2]}}
    start = {"sequence_id": {"int64_param": 2001}, "sequence_start": {"bool_param": True}}
    cases.append(
        Case("grpc-seq-start", "sequence", grpc_infer("accumulate", [g], parameters=start))
    )
    cases.append(
        Case(
            "grpc-seq-end",
            "sequence",
            grpc_infer(
                "accumulate",
                [g],
                parameters={
                    "sequence_id": {"int64_param": 2001},
                    "sequence_end": {"bool_param": True},
                },
            ),
        )
    )
    return cases


def statistics() -> list[Case]:
    cases = []
    for model in ("add_sub", "errors", "versioned", "ensemble_add_sub", UNKNOWN, "init_fails"):
        path = f"/v2/models/{model}/stats"
        cases.append(
            Case(f"http-stats-{model}", "statistics", Http("GET", path), ignore=STAT_VOLATILE)
        )
        cases.append(
            Case(
                f"grpc-stats-{model}",
                "statistics",
                Grpc("ModelStatistics", {"name": model}),
                ignore=STAT_VOLATILE,
            )
        )
    cases.append(
        Case(
            "http-stats-versioned-v3",
            "statistics",
            Http("GET", "/v2/models/versioned/versions/3/stats"),
            ignore=STAT_VOLATILE,
        )
    )
    cases.append(
        Case(
            "http-stats-versioned-v1",
            "statistics",
            Http("GET", "/v2/models/versioned/versions/1/stats"),
            ignore=STAT_VOLATILE,
        )
    )
    return cases


def settings() -> list[Case]:
    cases = [
        Case("http-trace-get", "trace", Http("GET", "/v2/trace/setting"), ignore=("trace_file",)),
        Case(
            "http-trace-model-get",
            "trace",
            Http("GET", "/v2/models/add_sub/trace/setting"),
            ignore=("trace_file",),
        ),
        Case(
            "http-trace-unknown-model", "trace", Http("GET", f"/v2/models/{UNKNOWN}/trace/setting")
        ),
        Case("grpc-trace-get", "trace", Grpc("TraceSetting"), ignore=("trace_file",)),
        Case("http-log-get", "logging", Http("GET", "/v2/logging")),
        Case("grpc-log-get", "logging", Grpc("LogSettings")),
    ]
    trace_posts: list[tuple[str, object]] = [
        ("rate", {"trace_rate": "5"}),
        ("rate-bad", {"trace_rate": "x"}),
        ("rate-int", {"trace_rate": 5}),
        ("level", {"trace_level": ["TIMESTAMPS"]}),
        ("level-bad", {"trace_level": ["NOPE"]}),
        ("level-string", {"trace_level": "TIMESTAMPS"}),
        ("count", {"trace_count": "3"}),
        ("count-neg", {"trace_count": "-5"}),
        ("log-frequency", {"log_frequency": "2"}),
        ("unknown-key", {"nope": "1"}),
        ("clear-rate", {"trace_rate": None}),
        ("level-off", {"trace_level": ["OFF"]}),
    ]
    for label, body in trace_posts:
        cases.append(
            Case(
                f"http-trace-post-{label}",
                "trace",
                Http("POST", "/v2/trace/setting", body),
                ignore=("trace_file",),
            )
        )
    log_posts: list[tuple[str, object]] = [
        ("verbose", {"log_verbose_level": 1}),
        ("verbose-bad", {"log_verbose_level": "x"}),
        ("verbose-neg", {"log_verbose_level": -1}),
        ("info", {"log_info": False}),
        ("info-bad", {"log_info": "no"}),
        ("format", {"log_format": "ISO8601"}),
        ("format-bad", {"log_format": "nope"}),
        ("unknown-key", {"nope": 1}),
        ("reset", {"log_verbose_level": 0, "log_info": True, "log_format": "default"}),
    ]
    for label, body in log_posts:
        cases.append(Case(f"http-log-post-{label}", "logging", Http("POST", "/v2/logging", body)))
    return cases


def model_control() -> list[Case]:
    load = "/v2/repository/models/{}/load"
    unload = "/v2/repository/models/{}/unload"
    spare_config = json.dumps(
        {
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
            "parameters": {"note": {"string_value": "override"}},
        }
    )
    upload_model = MODELS["spare"][1].encode()
    x = {"name": "X", "datatype": "INT32", "shape": [1], "data": [5]}
    return [
        Case("http-unload-spare", "model-control", Http("POST", unload.format("spare"), {})),
        Case("http-ready-after-unload", "model-control", Http("GET", "/v2/models/spare/ready")),
        Case("http-infer-after-unload", "model-control", infer("spare", {"inputs": [x]})),
        Case(
            "http-index-after-unload",
            "model-control",
            Http("POST", "/v2/repository/index", {}),
            sort_key="name",
        ),
        Case("http-load-spare", "model-control", Http("POST", load.format("spare"), {})),
        Case("http-infer-after-load", "model-control", infer("spare", {"inputs": [x]})),
        Case("http-unload-unknown", "model-control", Http("POST", unload.format(UNKNOWN), {})),
        Case("http-load-unknown", "model-control", Http("POST", load.format(UNKNOWN), {})),
        Case("http-load-broken", "model-control", Http("POST", load.format("bad_dims"), {})),
        Case("http-load-init-fails", "model-control", Http("POST", load.format("init_fails"), {})),
        Case(
            "http-load-override",
            "model-control",
            Http("POST", load.format("spare"), {"parameters": {"config": spare_config}}),
        ),
        Case("http-config-after-override", "model-control", Http("GET", "/v2/models/spare/config")),
        Case(
            "http-load-override-bad-json",
            "model-control",
            Http("POST", load.format("spare"), {"parameters": {"config": "{not json"}}),
        ),
        Case(
            "http-load-files",
            "model-control",
            Http(
                "POST",
                load.format("uploaded"),
                {"parameters": {"config": spare_config, "file:1/model.py": b64(upload_model)}},
            ),
        ),
        Case("http-infer-uploaded", "model-control", infer("uploaded", {"inputs": [x]})),
        Case("http-meta-uploaded", "model-control", Http("GET", "/v2/models/uploaded")),
        Case(
            "http-load-files-no-config",
            "model-control",
            Http(
                "POST",
                load.format("uploaded2"),
                {"parameters": {"file:1/model.py": b64(upload_model)}},
            ),
        ),
        Case("http-unload-uploaded", "model-control", Http("POST", unload.format("uploaded"), {})),
        Case(
            "grpc-unload-spare",
            "model-control",
            Grpc("RepositoryModelUnload", {"model_name": "spare"}),
        ),
        Case(
            "grpc-load-spare", "model-control", Grpc("RepositoryModelLoad", {"model_name": "spare"})
        ),
        Case(
            "grpc-unload-unknown",
            "model-control",
            Grpc("RepositoryModelUnload", {"model_name": UNKNOWN}),
        ),
        Case(
            "grpc-load-unknown",
            "model-control",
            Grpc("RepositoryModelLoad", {"model_name": UNKNOWN}),
        ),
        Case(
            "http-unload-ensemble-deps",
            "model-control",
            Http(
                "POST",
                unload.format("ensemble_add_sub"),
                {"parameters": {"unload_dependents": True}},
            ),
        ),
        Case(
            "http-ready-identity-after", "model-control", Http("GET", "/v2/models/identity/ready")
        ),
        Case(
            "http-load-ensemble", "model-control", Http("POST", load.format("ensemble_add_sub"), {})
        ),
        Case(
            "http-ready-ensemble", "model-control", Http("GET", "/v2/models/ensemble_add_sub/ready")
        ),
    ]


def _type_lines(names: tuple[str, ...]) -> object:
    def pick(text: str) -> list[str]:
        return sorted(
            line
            for line in text.splitlines()
            if line.startswith("# TYPE ") and line.split()[2] in names
        )

    return pick


METRIC_NAMES = (
    "requests_process_latency_ns", "conformance_gauge", "nv_inference_request_success",
    "nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
)  # fmt: skip


def _custom_samples(text: str) -> list[str]:
    """The custom families' samples, values as numbers (Triton writes 7, prometheus-client 7.0)."""
    picked = []
    for line in text.splitlines():
        if line.startswith(("requests_process_latency_ns{", "conformance_gauge{")):
            sample, value = line.rsplit(" ", 1)
            picked.append(f"{sample} {float(value)!r}")
    return sorted(picked)


def metrics() -> list[Case]:
    x = {"name": "X", "datatype": "INT32", "shape": [1], "data": [7]}
    cases = [
        Case("http-custom-metrics-infer", "metrics", infer("custom_metrics", {"inputs": [x]})),
        Case("http-custom-metrics-infer-2", "metrics", infer("custom_metrics", {"inputs": [x]})),
    ]
    for name in METRIC_NAMES:
        cases.append(
            Case(
                f"metrics-type-{name}",
                "metrics",
                Http("GET", "/metrics"),
                text=True,
                lines=_type_lines((name,)),  # type: ignore[arg-type]
                metrics=True,
            )
        )
    cases.append(
        Case(
            "metrics-custom-values",
            "metrics",
            Http("GET", "/metrics"),
            text=True,
            lines=_custom_samples,
            metrics=True,
        )
    )
    return cases


def shared_memory(key: str) -> list[Case]:
    region = {"key": key, "offset": 0, "byte_size": 64}
    return [
        Case(
            "http-shm-status-empty", "shared-memory", Http("GET", "/v2/systemsharedmemory/status")
        ),
        Case(
            "http-shm-register",
            "shared-memory",
            Http("POST", "/v2/systemsharedmemory/region/r1/register", region),
        ),
        Case(
            "http-shm-register-again",
            "shared-memory",
            Http("POST", "/v2/systemsharedmemory/region/r1/register", region),
        ),
        Case(
            "http-shm-register-missing-key",
            "shared-memory",
            Http(
                "POST",
                "/v2/systemsharedmemory/region/r2/register",
                {**region, "key": "/no_such_shm_key"},
            ),
        ),
        Case("http-shm-status", "shared-memory", Http("GET", "/v2/systemsharedmemory/status")),
        Case(
            "http-shm-status-r1",
            "shared-memory",
            Http("GET", "/v2/systemsharedmemory/region/r1/status"),
        ),
        Case(
            "http-shm-status-unknown",
            "shared-memory",
            Http("GET", "/v2/systemsharedmemory/region/nope/status"),
        ),
        Case(
            "http-shm-infer-input",
            "shared-memory",
            infer(
                "add_sub",
                {
                    "inputs": [
                        {
                            "name": n,
                            "datatype": "FP32",
                            "shape": [1, 4],
                            "parameters": {
                                "shared_memory_region": "r1",
                                "shared_memory_byte_size": 16,
                                "shared_memory_offset": off,
                            },
                        }
                        for n, off in (("INPUT0", 0), ("INPUT1", 16))
                    ]
                },
            ),
        ),
        Case(
            "http-shm-infer-output",
            "shared-memory",
            infer(
                "add_sub",
                {
                    "inputs": fp32_inputs(A, B),
                    "outputs": [
                        {
                            "name": "OUTPUT0",
                            "parameters": {
                                "shared_memory_region": "r1",
                                "shared_memory_byte_size": 16,
                                "shared_memory_offset": 32,
                            },
                        }
                    ],
                },
            ),
        ),
        Case(
            "http-shm-infer-out-of-range",
            "shared-memory",
            infer(
                "add_sub",
                {
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "datatype": "FP32",
                            "shape": [1, 4],
                            "parameters": {
                                "shared_memory_region": "r1",
                                "shared_memory_byte_size": 16,
                                "shared_memory_offset": 60,
                            },
                        },
                        fp32_inputs(A, B)[1],
                    ]
                },
            ),
        ),
        Case("grpc-shm-status", "shared-memory", Grpc("SystemSharedMemoryStatus")),
        Case(
            "http-shm-unregister",
            "shared-memory",
            Http("POST", "/v2/systemsharedmemory/region/r1/unregister"),
        ),
        Case(
            "http-shm-unregister-unknown",
            "shared-memory",
            Http("POST", "/v2/systemsharedmemory/region/zz/unregister"),
        ),
        Case(
            "grpc-shm-register",
            "shared-memory",
            Grpc("SystemSharedMemoryRegister", {"name": "g1", **region}),
        ),
        Case("grpc-shm-unregister-all", "shared-memory", Grpc("SystemSharedMemoryUnregister", {})),
        Case("http-shm-status-end", "shared-memory", Http("GET", "/v2/systemsharedmemory/status")),
    ]


READY_BODY = (
    'health and readiness bodies are the Open Inference Protocol\'s ({"live": true}, '
    '{"ready": true}, name and ready of a model), which KServe\'s SDK reads; Triton sends none'
)
CLIENT_ERROR = (
    "a malformed request or a field of the wrong type is the client's error: 400 (Triton: 500)"
)
SETTING_CHECKS = "settings Triton ignores or takes unchecked are refused here with 400 and a reason"
# Documented deviations (docs/api.md, "Differences from Triton"): id -> (reason, Triton, agent).
DEVIATIONS: dict[str, tuple[str, int | str, int | str]] = {
    "http-live": (READY_BODY, 200, 200),
    **{f"http-ready-{m}": (READY_BODY, 200, 200) for m in GOOD_MODELS},
    "http-ready-versioned-v2": (READY_BODY, 200, 200),
    "http-ready-versioned-v3": (READY_BODY, 200, 200),
    "http-ready-identity-after": (READY_BODY, 200, 200),
    "http-ready-ensemble": (READY_BODY, 200, 200),
    "http-malformed-json": (CLIENT_ERROR, 500, 400),
    "http-no-inputs-key": (CLIENT_ERROR, 500, 400),
    "http-data-count": (CLIENT_ERROR, 500, 400),
    "http-trace-post-rate-int": (CLIENT_ERROR, 500, 400),
    "http-trace-post-level-string": (CLIENT_ERROR, 500, 400),
    "http-log-post-verbose-bad": (CLIENT_ERROR, 500, 400),
    "http-log-post-verbose-neg": (CLIENT_ERROR, 500, 400),
    "http-log-post-info-bad": (CLIENT_ERROR, 500, 400),
    "http-log-post-format-bad": (CLIENT_ERROR, 503, 400),
    "http-shm-register-missing-key": (CLIENT_ERROR, 500, 400),
    "http-load-files-no-config": (
        "files without a config: we say what is missing (400); Triton fails the poll (500)",
        500,
        400,
    ),
    "http-trace-post-level-bad": (SETTING_CHECKS, 200, 400),
    "http-trace-post-unknown-key": (SETTING_CHECKS, 200, 400),
    "http-log-post-unknown-key": (SETTING_CHECKS, 200, 400),
    "grpc-seq-end": (
        "a sequence that waited for a free slot: Triton counts the wait as idle time and releases "
        "it right after its START ran (its next request is refused); ours counts from its START",
        "INVALID_ARGUMENT",
        "OK",
    ),
    **{
        f"{t}-model-error-{c}": (
            "a raised TritonError: Triton's cannot be raised (TypeError: exceptions must derive "
            "from BaseException); ours can and fails the request as any exception, with its text",
            500 if t == "http" else "INTERNAL",
            500 if t == "http" else "INTERNAL",
        )
        for t in ("http", "grpc")
        for c in range(20, 28)
    },
    **{
        case: (
            "FP16 in JSON is served (the Open Inference Protocol allows every datatype in JSON); "
            "Triton refuses it (400) and asks for the binary extension",
            400,
            200,
        )
        for case in ("http-json-FP16", "http-binary-in-json-out-FP16")
    },
}
DUP_INPUT = (
    "a config that declares an input twice: Triton loads it (READY, the input listed twice in "
    "its metadata); the agent refuses it with its config (the index has its name alone, its "
    "metadata error the reason)"
)
UNLOADING = (
    "an unload: Triton answers it at once and reports the model UNLOADING while its Python stub "
    "stops; the agent answers once the model is unloaded (UNAVAILABLE, 'unloaded')"
)
# Documented deviations confined to some rows of a list answer (the index, rows by name): case
# id, or prefix ending in "-" -> (reason, rows). Those rows are left out of both bodies; the rest
# must agree.
ROW_DEVIATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "http-index-": (DUP_INPUT, ("dup_input",)),
    "grpc-index-": (DUP_INPUT, ("dup_input",)),
    "http-index-after-unload": (UNLOADING, ("spare",)),
}
# Differences found and not fixed yet: case id (or prefix, ending in "-") -> what differs.
# Each stays an xfail that names it until the agent answers as Triton does.
KNOWN: dict[str, str] = {}


# Cases under a KNOWN prefix that answer as Triton does (measured; they must keep passing).
AGREE: frozenset[str] = frozenset()


def _marked(case: Case) -> Case:
    if case.id in DEVIATIONS:
        reason, triton, agent = DEVIATIONS[case.id]
        return replace(case, deviation=reason, triton_status=triton, agent_status=agent)
    if case.id in AGREE:
        return case
    for prefix, (_, rows) in ROW_DEVIATIONS.items():
        if case.id == prefix or (prefix.endswith("-") and case.id.startswith(prefix)):
            case = replace(case, sort_key="name", skip_rows=(*case.skip_rows, *rows))
    for prefix, reason in KNOWN.items():
        if case.id == prefix or (prefix.endswith("-") and case.id.startswith(prefix)):
            return replace(case, known=reason)
    return case


def corpus(shm_key: str) -> list[Case]:
    """Every case, in the order they run, with its documented deviation or known difference."""
    return [_marked(c) for c in _cases(shm_key)]


def _cases(shm_key: str) -> list[Case]:
    return [
        *health(),
        *metadata(),
        *config(),
        *readiness(),
        *index(),
        *datatypes(),
        *inference(),
        *model_errors(),
        *parameters(),
        *bls_ensemble(),
        *decoupled_sequence(),
        *metrics(),
        *shared_memory(shm_key),
        *statistics(),
        *settings(),
        *model_control(),
    ]
