"""Errors of the runtime.

RuntimeFailure           root: the attempt failed; ``reason`` is a stable code for status and retry
├── InputsError          plan, recipe or snapshot missing or not matching its recorded sha256
├── SecretMissingError   an API-key variable the snapshot names is unset in the job's environment
├── EngineError          Data Designer failed (``retryable`` says whether a new attempt may help)
└── VerificationError    the candidate dataset is unreadable, short, or leaks a secret
"""

from __future__ import annotations


class RuntimeFailure(Exception):
    """Root of the errors raised by ddslurm.runtime."""

    reason = "internal"
    retryable = False

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class InputsError(RuntimeFailure):
    reason = "inputs_invalid"


class SecretMissingError(RuntimeFailure):
    reason = "secret_missing"


class EngineError(RuntimeFailure):
    reason = "generation_failed"

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class OutputExistsError(RuntimeFailure):
    """The attempt's dataset path exists (non-empty, or a symbolic link): it is never touched."""

    reason = "output_exists"


class VerificationError(RuntimeFailure):
    reason = "output_invalid"
