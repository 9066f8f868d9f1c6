"""Triton's logging extension (`/v2/logging`, gRPC LogSettings) with Triton's own clients."""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from agent.runtime.daemon import RunningAgent
from agent.serving.log_settings import AGENT_HANDLER_NAME, LogSettings

KEYS = ["log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"]


@pytest.fixture
def http_client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url)


@pytest.fixture
def grpc_client(agent: RunningAgent) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")


@pytest.fixture(autouse=True)
def restore_logging(agent: RunningAgent) -> Iterator[None]:
    """Logging is process-wide: put the root level and the agent's settings back after a test."""
    root = logging.getLogger()
    level = root.level
    settings = agent.dataplane.log_settings
    before = settings.get()
    yield
    settings.update({k: v for k, v in before.items() if k != "log_file"})
    root.setLevel(level)


def _grpc_settings(client: grpcclient.InferenceServerClient, **kw: Any) -> dict[str, Any]:
    doc = (
        client.update_log_settings(kw, as_json=True)
        if kw
        else client.get_log_settings(as_json=True)
    )
    # MessageToJson writes uint32 as a number, each value as {"<kind>_param": value}.
    return {key: next(iter(value.values())) for key, value in doc["settings"].items()}


def _register_and_unregister(client: httpclient.InferenceServerClient, tag: str) -> None:
    """Two INFO records from the agent (shared memory registered, then unregistered)."""
    key = f"/edge_agent_log_{os.getpid()}_{tag}"
    handle = shm.create_shared_memory_region(tag, key, 64)
    try:
        client.register_system_shared_memory(tag, key, 64)
        client.unregister_system_shared_memory(tag)
    finally:
        shm.destroy_shared_memory_region(handle)


def test_extension_is_advertised(http_client: httpclient.InferenceServerClient) -> None:
    assert "logging" in http_client.get_server_metadata()["extensions"]


def test_get_returns_every_setting_with_triton_types(
    http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    doc = http_client.get_log_settings()
    assert list(doc) == KEYS
    assert doc["log_file"] == ""
    assert doc["log_format"] == "default"
    assert all(isinstance(doc[k], bool) for k in ("log_info", "log_warning", "log_error"))
    assert isinstance(doc["log_verbose_level"], int)
    assert _grpc_settings(grpc_client) == doc
    message = grpc_client.get_log_settings()
    assert message.settings["log_info"].WhichOneof("parameter_choice") == "bool_param"
    assert message.settings["log_verbose_level"].WhichOneof("parameter_choice") == "uint32_param"
    assert message.settings["log_format"].WhichOneof("parameter_choice") == "string_param"


def test_http_update_changes_only_what_is_named(
    http_client: httpclient.InferenceServerClient,
) -> None:
    before = http_client.get_log_settings()
    after = http_client.update_log_settings({"log_verbose_level": 1})
    assert after == {**before, "log_verbose_level": 1}
    assert http_client.get_log_settings() == after
    after = http_client.update_log_settings({"log_format": "ISO8601", "log_warning": False})
    assert after["log_format"] == "ISO8601"
    assert after["log_warning"] is False
    assert after["log_verbose_level"] == 1
    # null leaves a setting as it is (tritonclient sends None for "clear")
    assert http_client.update_log_settings({"log_info": None}) == after


def test_grpc_update_changes_only_what_is_named(
    grpc_client: grpcclient.InferenceServerClient, http_client: httpclient.InferenceServerClient
) -> None:
    before = _grpc_settings(grpc_client)
    after = _grpc_settings(grpc_client, log_verbose_level=2, log_error=True, log_info=False)
    assert after == {**before, "log_verbose_level": 2, "log_error": True, "log_info": False}
    assert http_client.get_log_settings() == after  # one set of settings for both transports


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"log_info": "yes"}, "expect boolean for 'log_info'"),
        ({"log_warning": 1}, "expect boolean for 'log_warning'"),
        ({"log_verbose_level": -1}, "expect unsigned integer for 'log_verbose_level'"),
        ({"log_verbose_level": True}, "expect unsigned integer for 'log_verbose_level'"),
        ({"log_verbose_level": 1.5}, "expect unsigned integer for 'log_verbose_level'"),
        ({"log_format": 3}, "expect string for 'log_format'"),
        ({"log_format": "json"}, "invalid argument for log_format, got: json"),
        ({"log_file": "/tmp/x.log"}, "log file location can not be updated through network"),
        ({"log_level": "debug"}, "unknown log setting 'log_level'"),
    ],
)
def test_http_bad_values_are_refused_with_400(
    http_client: httpclient.InferenceServerClient, settings: dict[str, Any], message: str
) -> None:
    before = http_client.get_log_settings()
    with pytest.raises(InferenceServerException, match=re.escape(message)) as info:
        http_client.update_log_settings({"log_verbose_level": 3, **settings})
    assert info.value.status() == "400"
    assert http_client.get_log_settings() == before  # a refused request changes nothing


def test_http_body_must_be_an_object(url: str) -> None:
    import urllib.request

    request = urllib.request.Request(f"http://{url}/v2/logging", data=b"[1]", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"log_format": "xml"}, "invalid argument for log_format, got: xml"),
        ({"log_file": "/tmp/x.log"}, "log file location can not be updated through network"),
        ({"verbose": True}, "unknown log setting 'verbose'"),
    ],
)
def test_grpc_bad_values_are_invalid_argument(
    grpc_client: grpcclient.InferenceServerClient, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(InferenceServerException, match=re.escape(message)) as info:
        grpc_client.update_log_settings(settings)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("key", "field", "value", "message"),
    [
        ("log_verbose_level", "string_param", "1", "expect unsigned integer for"),
        ("log_info", "uint32_param", 1, "expect boolean for 'log_info'"),
        ("log_format", "bool_param", True, "expect string for 'log_format'"),
    ],
)
def test_grpc_wrong_oneof_is_refused(
    agent: RunningAgent, key: str, field: str, value: Any, message: str
) -> None:
    """tritonclient picks the oneof by key; a raw stub can send the wrong one."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.LogSettingsRequest()
    setattr(request.settings[key], field, value)
    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.LogSettings(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")


def test_log_info_off_silences_the_agents_info_records(
    http_client: httpclient.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    http_client.update_log_settings({"log_info": True, "log_verbose_level": 0})
    _register_and_unregister(http_client, "on")
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("agent.")]
    assert "registered shared memory region on (key" in " ".join(messages)
    caplog.clear()
    http_client.update_log_settings({"log_info": False})
    _register_and_unregister(http_client, "off")
    assert not [r for r in caplog.records if r.name.startswith("agent.")]


def test_verbose_level_switches_debug_records(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    agent_logger = logging.getLogger("agent.serving.dataplane")
    grpc_client.update_log_settings({"log_verbose_level": 0, "log_info": True})
    assert not agent_logger.isEnabledFor(logging.DEBUG)
    assert agent_logger.isEnabledFor(logging.INFO)
    grpc_client.update_log_settings({"log_verbose_level": 1})
    assert agent_logger.isEnabledFor(logging.DEBUG)


def test_a_level_off_between_two_on_is_filtered(
    http_client: httpclient.InferenceServerClient,
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.set_name(AGENT_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        http_client.update_log_settings(
            {"log_info": True, "log_warning": False, "log_error": True, "log_format": "default"}
        )
        log = logging.getLogger("agent.test_logging")
        log.info("an info")
        log.warning("a warning")
        log.error("an error")
        lines = stream.getvalue().splitlines()
        assert [line.split(": ", 1)[1] for line in lines] == ["an info", "an error"]
        # the agent's own handler takes the new format live
        http_client.update_log_settings({"log_format": "ISO8601"})
        log.error("iso")
        last = stream.getvalue().splitlines()[-1]
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ERROR agent.test_logging: iso$", last)
    finally:
        root.removeHandler(handler)


def test_initial_settings_follow_the_configured_level() -> None:
    root = logging.Logger("probe")
    root.setLevel(logging.DEBUG)
    assert LogSettings(root=root).get()["log_verbose_level"] == 1
    root.setLevel(logging.WARNING)
    settings = LogSettings("/var/log/agent.log", root=root).get()
    assert settings["log_file"] == "/var/log/agent.log"
    assert (settings["log_info"], settings["log_warning"], settings["log_error"]) == (
        False,
        True,
        True,
    )


def test_set_level_resets_every_switch() -> None:
    """SIGHUP's `log.level` goes through the same settings, so `/v2/logging` stays true."""
    root = logging.Logger("probe")
    root.setLevel(logging.INFO)
    settings = LogSettings(root=root)
    settings.update({"log_warning": False, "log_verbose_level": 4})
    settings.set_level("error")
    assert settings.get()["log_info"] is False
    assert settings.get()["log_warning"] is False
    assert settings.get()["log_error"] is True
    assert settings.get()["log_verbose_level"] == 0
    assert root.level == logging.ERROR
    settings.set_level("debug")
    assert settings.get()["log_verbose_level"] == 1
    assert root.level == logging.DEBUG
