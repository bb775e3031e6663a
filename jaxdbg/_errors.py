"""Errors jaxdbg raises on purpose.

Library code raises these; only the command line turns them into an exit code and one line on stderr
(see ``jaxdbg.cli._common.execute``). Each message says what went wrong, why, and what to do.

Example:
    >>> err = UsageError("--args 'f33[2]': unknown dtype 'f33'; use one of f32, bf16, i32, ...")
    >>> err.exit_code, err.message == str(err), TargetFailedError("the target timed out").exit_code
    (2, True, 3)
    >>> import pickle; copy = pickle.loads(pickle.dumps(err))   # crosses a process boundary as itself
    >>> type(copy).__name__, copy.message == err.message
    ('UsageError', True)
    >>> raise err
    Traceback (most recent call last):
    ...
    jaxdbg._errors.UsageError: --args 'f33[2]': unknown dtype 'f33'; use one of f32, bf16, i32, ...
"""

from __future__ import annotations

from typing import Any

# Exit codes of the command-line contract.
EXIT_OK = 0
EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_TARGET_FAILED = 3


class JaxdbgError(Exception):
    """An expected failure with a one-line, user-facing message and the exit code it maps to."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as itself whatever a subclass's __init__ takes: it crosses from a contained child to the
        # parent (jaxdbg.protocol.ExceptionInfo.error) and is raised there again.
        return _restore, (type(self), self.args, dict(self.__dict__))


def _restore(cls: type[JaxdbgError], args: tuple[Any, ...], state: dict[str, Any]) -> JaxdbgError:
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(state)
    return err


class UsageError(JaxdbgError):
    """Bad usage or bad input: unknown option, missing file, unparsable spec (exit 2)."""

    exit_code = EXIT_USAGE


class TargetFailedError(JaxdbgError):
    """The target failed in a way the command cannot analyse: crashed before any JAX work, timed out (exit 3)."""

    exit_code = EXIT_TARGET_FAILED


def error_for_exit_code(code: int) -> type[JaxdbgError]:
    """The error class that maps to ``code`` (a child's error is raised again as the same kind in the parent).

    Example:
        >>> error_for_exit_code(2).__name__, error_for_exit_code(3).__name__
        ('UsageError', 'TargetFailedError')
    """
    return {EXIT_USAGE: UsageError, EXIT_TARGET_FAILED: TargetFailedError}.get(code, JaxdbgError)


class JobMismatchError(UsageError):
    """The processes of one ``jax.distributed`` job run different jaxdbg commands (exit 2 in every process)."""
