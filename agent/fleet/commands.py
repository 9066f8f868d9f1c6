"""Fleet commands: bytes from the broker → typed commands. Pure: no I/O, no clock.

A command is a JSON object:

    {"schema": 1, "id": "c-42", "command": "activate", "args": {"model": "m", "version": 2}}

`schema` is optional (1 when given); `args` is optional for commands that take none. Every
argument is checked here, with strict types and no unknown keys, so the fleet link only executes
well-formed commands. Anything else raises a `CommandError` (an `InvalidInputError`), or
`CommandTooLargeError` (a `PayloadTooLargeError`) for a payload over the limit; both carry the
command id when it could be read, so that the error response can still name it.

Commands and their arguments:

    status                                      the status document
    ping                                        {"pong": true}
    rebirth                                     re-publish the retained status (inventory)
    sync                                        run a sync cycle now
    set-desired   models: {MODEL|"*": POLICY}   POLICY: "latest", "N" or "N,M,..." (persisted);
                                                also lifts the named models' rejected versions
    load          model, config?: object        explicit load (config: Triton JSON override)
    unload        model
    activate      model, version: int           hot swap to a cached version
    rollback      model, version?: int          back to a retained version (default: previous)
    clear-rejected model, version?: int         the sync may activate rejected versions again
    set-batching  model, version?: int, max_batch_size?: int, max_queue_delay_us?: int,
                  preferred_batch_sizes?: [int]  live; a reload restores the config's values
    canary-start  model, version: int, share: number, promote_after?, window?, min_requests?,
                  max_error_rate?, max_p95_ms?   (see agent/canary/policy.py)
    canary-stop   model                         back to the baseline (or drop the pin)
    canary-status model

`canary_start`, `canary_stop` and `canary_status` are accepted as the same commands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.canary.policy import CanaryPolicy, CanaryPolicyError, parse_policy
from agent.errors import InvalidInputError, PayloadTooLargeError

SCHEMA = 1
MAX_MODELS = 256  # entries in one set-desired
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_POLICY = re.compile(r"^(latest|[1-9][0-9]{0,8}(,[1-9][0-9]{0,8}){0,31})$")


class CommandError(InvalidInputError):
    """A command that cannot be executed as sent (bad JSON, unknown command, bad arguments)."""

    def __init__(self, message: str, command_id: str | None = None) -> None:
        super().__init__(message)
        self.command_id = command_id


class CommandTooLargeError(PayloadTooLargeError):
    """A command payload over the size limit; it is not parsed."""

    def __init__(self, message: str, command_id: str | None = None) -> None:
        super().__init__(message)
        self.command_id = command_id


@dataclass(frozen=True, slots=True)
class Status:
    """Report the status document."""


@dataclass(frozen=True, slots=True)
class Ping:
    """Answer at once (liveness of the command path)."""


@dataclass(frozen=True, slots=True)
class Rebirth:
    """Read the device facts again and re-publish the retained status (the inventory)."""


@dataclass(frozen=True, slots=True)
class Sync:
    """Run a sync cycle now."""


@dataclass(frozen=True, slots=True)
class SetDesired:
    """Replace the desired state: (model or "*", policy) pairs, sorted by model."""

    models: tuple[tuple[str, str], ...]

    def as_lines(self) -> tuple[str, ...]:
        """`MODEL=POLICY` strings, as `edge-agent sync --desired` takes them."""
        return tuple(f"{m}={p}" for m, p in self.models)


@dataclass(frozen=True, slots=True)
class Load:
    """Load (or reload) a model, optionally with a Triton JSON config override."""

    model: str
    config: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Unload:
    """Stop serving a model."""

    model: str


@dataclass(frozen=True, slots=True)
class Activate:
    """Hot-swap a model to a version the cache holds."""

    model: str
    version: int


@dataclass(frozen=True, slots=True)
class Rollback:
    """Go back to a retained version (None: the previous one)."""

    model: str
    version: int | None = None


@dataclass(frozen=True, slots=True)
class ClearRejected:
    """Lift a model's rejected versions (one, or all: None), so the sync may activate them."""

    model: str
    version: int | None = None


@dataclass(frozen=True, slots=True)
class SetBatching:
    """Change dynamic batching parameters of loaded versions live (None: keep as is)."""

    model: str
    version: int | None = None  # None: every loaded version
    max_batch_size: int | None = None
    max_queue_delay_us: int | None = None
    preferred_batch_sizes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class CanaryStart:
    """Start a canary rollout of a model's version."""

    model: str
    policy: CanaryPolicy


@dataclass(frozen=True, slots=True)
class CanaryStop:
    """Stop a model's canary (its traffic goes back to the baseline), or drop its pin."""

    model: str


@dataclass(frozen=True, slots=True)
class CanaryStatus:
    """Report a model's canary."""

    model: str


CommandBody = (
    Status
    | Ping
    | Rebirth
    | Sync
    | SetDesired
    | Load
    | Unload
    | Activate
    | Rollback
    | ClearRejected
    | SetBatching
    | CanaryStart
    | CanaryStop
    | CanaryStatus
)
#: Answered at once, never queued behind a long command.
READ_ONLY = (Status, Ping, Rebirth, CanaryStatus)


@dataclass(frozen=True, slots=True)
class Command:
    """A validated command: its id, its wire name and its typed arguments."""

    id: str
    name: str
    body: CommandBody


def parse_command(payload: bytes, *, max_bytes: int) -> Command:
    """Parse and validate one command payload.

    Args:
        payload: The MQTT message payload.
        max_bytes: Larger payloads are refused before any parsing.

    Raises:
        CommandTooLargeError: the payload is over `max_bytes`.
        CommandError: not UTF-8 JSON, not an object, bad or missing id, unknown schema or
            command, or bad arguments.

    Returns:
        The typed command.
    """
    if len(payload) > max_bytes:
        raise CommandTooLargeError(f"command is {len(payload)} bytes, over the {max_bytes} limit")
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CommandError(f"command is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CommandError("command must be a JSON object")
    raw_id = doc.get("id")
    command_id = raw_id if isinstance(raw_id, str) and _ID.match(raw_id) else None
    if command_id is None:
        raise CommandError("command 'id' must be a string of 1-128 of A-Z a-z 0-9 . _ : -")
    _check_keys(doc, {"schema", "id", "command", "args"}, "command", command_id)
    if doc.get("schema", SCHEMA) != SCHEMA:
        raise CommandError(f"unsupported schema {doc.get('schema')!r} (this agent: 1)", command_id)
    name = doc.get("command")
    if not isinstance(name, str) or name not in _PARSERS:
        raise CommandError(
            f"unknown command {name!r} (known: {', '.join(sorted(_PARSERS))})", command_id
        )
    args = doc.get("args", {})
    if not isinstance(args, dict):
        raise CommandError("'args' must be a JSON object", command_id)
    try:
        body = _PARSERS[name](_Args(args, name))
    except CommandError as exc:
        raise CommandError(exc.message, command_id) from None
    return Command(command_id, name, body)


def _check_keys(doc: Mapping[str, Any], known: set[str], what: str, cid: str | None) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise CommandError(f"unknown {what} key(s): {', '.join(map(str, unknown))}", cid)


class _Args:
    """Typed access to a command's arguments; every key must be read once (no unknown keys)."""

    def __init__(self, args: Mapping[str, Any], command: str) -> None:
        self._args = args
        self._command = command
        self._read: set[str] = set()

    def model(self, key: str = "model") -> str:
        value = self._get(key, required=True)
        if not isinstance(value, str) or not _NAME.match(value):
            raise CommandError(f"'{key}' must be a model name (A-Z a-z 0-9 . _ -)")
        return value

    def integer(self, key: str, *, required: bool = False, minimum: int = 1) -> int | None:
        value = self._get(key, required=required)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise CommandError(f"'{key}' must be an integer >= {minimum}, got {value!r}")
        if value > 2**31:
            raise CommandError(f"'{key}' is too large: {value}")
        return value

    def obj(self, key: str) -> Mapping[str, Any] | None:
        value = self._get(key, required=False)
        if value is not None and not isinstance(value, dict):
            raise CommandError(f"'{key}' must be a JSON object")
        return value

    def ints(self, key: str) -> tuple[int, ...] | None:
        value = self._get(key, required=False)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) > 64:
            raise CommandError(f"'{key}' must be a list of at most 64 integers")
        for item in value:
            if not isinstance(item, int) or isinstance(item, bool) or not 1 <= item <= 2**31:
                raise CommandError(f"'{key}' must hold integers >= 1, got {item!r}")
        return tuple(value)

    def rest(self) -> dict[str, Any]:
        """The arguments not read yet (they count as read)."""
        left = {k: v for k, v in self._args.items() if k not in self._read}
        self._read.update(left)
        return left

    def done(self) -> None:
        _check_keys(self._args, self._read, f"argument for '{self._command}'", None)

    def _get(self, key: str, *, required: bool) -> Any:
        self._read.add(key)
        value = self._args.get(key)
        if value is None and required:
            raise CommandError(f"'{self._command}' needs the argument '{key}'")
        return value


def _none(make: type[Status | Ping | Rebirth | Sync]) -> Any:
    def parse(args: _Args) -> CommandBody:
        args.done()
        return make()

    return parse


def _set_desired(args: _Args) -> SetDesired:
    models = args.obj("models")
    args.done()
    if models is None:
        raise CommandError("'set-desired' needs the argument 'models': {MODEL: POLICY}")
    if len(models) > MAX_MODELS:
        raise CommandError(f"'models' has {len(models)} entries, over {MAX_MODELS}")
    pairs: list[tuple[str, str]] = []
    for model, policy in models.items():
        if model != "*" and not _NAME.match(model):
            raise CommandError(f"'models' key {model!r} is not a model name or *")
        if not isinstance(policy, str) or not _POLICY.match(policy):
            raise CommandError(
                f'policy of {model!r} must be "latest", "N" or "N,M,...", got {policy!r}'
            )
        pairs.append((model, policy))
    return SetDesired(tuple(sorted(pairs)))


def _load(args: _Args) -> Load:
    body = Load(args.model(), args.obj("config"))
    args.done()
    return body


def _unload(args: _Args) -> Unload:
    body = Unload(args.model())
    args.done()
    return body


def _activate(args: _Args) -> Activate:
    model = args.model()
    version = args.integer("version", required=True)
    assert version is not None
    args.done()
    return Activate(model, version)


def _rollback(args: _Args) -> Rollback:
    body = Rollback(args.model(), args.integer("version"))
    args.done()
    return body


def _clear_rejected(args: _Args) -> ClearRejected:
    body = ClearRejected(args.model(), args.integer("version"))
    args.done()
    return body


def _set_batching(args: _Args) -> SetBatching:
    body = SetBatching(
        model=args.model(),
        version=args.integer("version"),
        max_batch_size=args.integer("max_batch_size"),
        max_queue_delay_us=args.integer("max_queue_delay_us", minimum=0),
        preferred_batch_sizes=args.ints("preferred_batch_sizes"),
    )
    args.done()
    if (body.max_batch_size, body.max_queue_delay_us, body.preferred_batch_sizes) == (None,) * 3:
        raise CommandError(
            "'set-batching' needs at least one of max_batch_size, max_queue_delay_us, "
            "preferred_batch_sizes"
        )
    return body


def _canary_start(args: _Args) -> CanaryStart:
    model = args.model()
    try:
        policy = parse_policy(args.rest())
    except CanaryPolicyError as exc:
        raise CommandError(exc.message) from None
    return CanaryStart(model, policy)


def _canary_stop(args: _Args) -> CanaryStop:
    body = CanaryStop(args.model())
    args.done()
    return body


def _canary_status(args: _Args) -> CanaryStatus:
    body = CanaryStatus(args.model())
    args.done()
    return body


_PARSERS = {
    "status": _none(Status),
    "ping": _none(Ping),
    "rebirth": _none(Rebirth),
    "sync": _none(Sync),
    "set-desired": _set_desired,
    "load": _load,
    "unload": _unload,
    "activate": _activate,
    "rollback": _rollback,
    "clear-rejected": _clear_rejected,
    "set-batching": _set_batching,
    "canary-start": _canary_start,
    "canary-stop": _canary_stop,
    "canary-status": _canary_status,
    "canary_start": _canary_start,
    "canary_stop": _canary_stop,
    "canary_status": _canary_status,
}
