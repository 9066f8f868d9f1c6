"""Worker side of a decoupled Python model (`model_transaction_policy { decoupled: true }`).

Each request of an EXECUTE message carries the agent's id for it; the model answers through
`request.get_response_sender()`, from `execute` or from any thread afterwards, and each `send`
goes to the agent at once as one RESPONSE message. `execute` returns None; when it returns the
worker answers RESULT, which frees the instance for the next batch while responses may still
follow (as in Triton).

The worker's pipe reader (`agent.backends.python.worker.mailbox`) hands CANCEL messages with a
request id (the client went away) to `cancel` at any time, even while `execute` runs a long loop, so
`request.is_cancelled()` turns true there; one that arrives before its EXECUTE was unpacked is
kept until then.

Errors, in Triton's words: `execute` raised, or returned something other than None ("... is
using the decoupled mode and the execute function must return None."): every request whose
sender is still open gets an error response with the final flag.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import threading
import traceback
from collections.abc import Callable
from typing import Any

from agent import pb_utils
from agent.backends.python import ipc
from agent.pb_utils.request import received_request

# An output response's tensors, or why they cannot be sent (python_worker's checks).
TensorsOf = Callable[[Any], "list[tuple[str, Any]] | dict[str, Any]"]


class DecoupledRuntime:
    """Runs `execute` the decoupled way and marks cancelled requests."""

    def __init__(
        self,
        send: Callable[[ipc.Message], None],
        model_name: str,
        tensors_of: TensorsOf,
        run_coroutine: Callable[[Any], Any],
    ) -> None:
        self._send = send
        self._name = model_name
        self._tensors_of = tensors_of
        self._run_coroutine = run_coroutine
        self._lock = threading.Lock()
        self._open: dict[int, pb_utils.InferenceRequest] = {}
        self._early: set[int] = set()  # cancelled before their EXECUTE was unpacked
        self._newest = 0  # the highest request id unpacked (ids only grow)

    def cancel(self, message: ipc.Message) -> None:
        """CANCEL meta {"id"} (the reading thread): mark that request cancelled."""
        request_id = message.meta.get("id")
        if not isinstance(request_id, int):
            return
        with self._lock:
            request = self._open.get(request_id)
            if request is not None:
                request.set_cancelled()
            elif request_id > self._newest:  # its EXECUTE is still queued
                self._early.add(request_id)

    def execute(self, model: Any, message: ipc.Message) -> ipc.Message:
        """One `execute` call on the message's requests; RESULT once it returned."""
        requests: list[pb_utils.InferenceRequest] = []
        senders: list[pb_utils.InferenceResponseSender] = []
        offset = 0
        for item in message.meta.get("requests", []):
            count = int(item.get("inputs", 0))
            inputs = [pb_utils.Tensor(n, a) for n, a in message.tensors[offset : offset + count]]
            offset += count
            request = received_request(inputs, [str(n) for n in item["outputs"]], item)
            request_id = int(item["id"])
            with self._lock:
                self._open[request_id] = request
                self._newest = max(self._newest, request_id)
                if request_id in self._early:
                    self._early.discard(request_id)
                    request.set_cancelled()
            sender = pb_utils.InferenceResponseSender(
                self._transport(request_id), request.is_cancelled
            )
            request.set_response_sender(sender)
            requests.append(request)
            senders.append(sender)
        problem: str | None = None
        try:
            returned = model.execute(requests)
            if inspect.isawaitable(returned):  # `async def execute`, as Triton allows
                returned = self._run_coroutine(returned)
            if returned is not None:
                problem = (
                    f"Python model '{self._name}' is using the decoupled mode and the execute "
                    "function must return None."
                )
        except Exception as exc:  # noqa: BLE001 - user code: report it, stay alive
            traceback.print_exc()
            text = exc.message() if isinstance(exc, pb_utils.ModelError) else str(exc)
            problem = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        if problem is not None:
            for sender in senders:
                self._close_with_error(sender, problem)
        return ipc.Message(ipc.RESULT, {"responses": []})

    def _close_with_error(self, sender: pb_utils.InferenceResponseSender, problem: str) -> None:
        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(problem))
        # Closed meanwhile by the model's own final flag: nothing to add.
        with contextlib.suppress(pb_utils.TritonModelException):
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _transport(
        self, request_id: int
    ) -> Callable[[pb_utils.InferenceResponse | None, bool], None]:
        def transport(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            meta: dict[str, Any] = {"id": request_id, "final": final}
            tensors: list[tuple[str, Any]] = []
            if response is not None:
                meta["response"] = True
                error = response.error()
                if error is not None:
                    text = error.message() if isinstance(error, pb_utils.ModelError) else error
                    meta["error"] = str(text)
                else:
                    outcome = self._tensors_of(response)
                    if isinstance(outcome, dict):
                        meta["error"] = str(outcome["error"])
                    else:
                        tensors = outcome
                        params = json.loads(response.parameters())
                        if params:  # the model's response parameters (rare: most set none)
                            meta["parameters"] = params
            if final:
                with self._lock:
                    self._open.pop(request_id, None)
            try:
                self._send(ipc.Message(ipc.RESPONSE, meta, tensors))
            except OSError as exc:
                raise pb_utils.TritonModelException(f"Unable to send response: {exc}") from None

        return transport
