"""Triton's errors of `triton_python_backend_utils`: `TritonError` and `TritonModelException`.

Re-exported by `agent.pb_utils`; needs only the standard library.
"""

from __future__ import annotations


class ModelError(Exception):
    """An error a model reports for a request (Triton's `TritonError`).

    Put it in `InferenceResponse(error=...)`, or raise it from `execute`.
    """

    # Triton's error codes (`pb_utils.TritonError.CANCELLED` ...); the default is INTERNAL.
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self._message = message
        self._code = self.INTERNAL if code is None else int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


TritonError = ModelError


class TritonModelException(ModelError):
    """Triton's exception for a model's failure: raise it from any `TritonPythonModel` method."""
