"""Copies between host and device, and the forced synchronisations, timed at the user's line: what
:func:`timed_transfers` patches while a script runs under ``jaxdbg profile`` (each patch put back in ``finally``).

Copies to the device: ``jax.device_put``, and ``jnp.asarray``/``jnp.array`` of a numpy array (wrapped themselves:
jax 0.10/0.11 stage a numpy array with a small ``jit(stage)``, or convert it when a dtype is given, neither through
``device_put``); numpy arguments of a jitted call are copied by the profile itself just before the call
(``implicit_args``, :meth:`Recorder._put_host_args`).

Synchronisations: every read of a device array on the host waits for the computation that makes it, then
copies it (``to_host``): ``float``/``int``/``bool``, ``.item()``, ``.tolist()``, ``print`` and f-strings
(``ArrayImpl._value``), ``np.asarray``/``np.array`` (jax arrays serve numpy through the buffer protocol on CPU,
which no Python attribute sees, so ``numpy.asarray``/``numpy.array`` themselves are wrapped: one type check per
call for any other argument), ``jax.device_get``; ``jax.block_until_ready`` and ``x.block_until_ready()`` wait
without copying. Each one is filed under its kind and the user's line with the time it waited, and handed to the
recorder's :class:`~jaxdbg.profile.host_bound.StepClock` (main thread only: another thread's wait does not stall
the step loop).

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from jaxdbg.profile.instrument import Recorder
    >>> recorder = Recorder(send=lambda message: None, out_dir="")
    >>> with timed_transfers(recorder):
    ...     total = jnp.asarray(np.ones(3, np.float32)).sum()
    ...     value = float(total)
    >>> sorted(kind for kind, _ in recorder.transfers), sorted(kind for kind, _ in recorder.syncs)
    (['jnp.asarray', 'to_host'], ['float()'])
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

from jaxdbg import _compat
from jaxdbg._source import caller_user_frame
from jaxdbg.profile.host_bound import EQX_WAIT

# What the user wrote, by the function of jax's that reached ``ArrayImpl._value`` or ``numpy.asarray``.
_READ_KINDS = {"__float__": "float()", "__int__": "int()", "__index__": "int()", "__complex__": "complex()",
               "__bool__": "bool()", "__format__": "print/format", "__str__": "print/format",
               "__repr__": "print/format", "tolist": "tolist()", "tobytes": "tobytes()", "_item": ".item()",
               "__array__": "np.asarray"}


_EQX_JIT = os.path.join("equinox", "_jit.py")


def read_kind(default: str) -> str:
    """The user's spelling of a host read, from the jax method a few frames up (``__float__``: ``float()``)."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            break
        kind = _READ_KINDS.get(frame.f_code.co_name)
        if kind is not None:
            return kind
        frame = frame.f_back
    return default


@contextlib.contextmanager
def timed_transfers(recorder: Any) -> Iterator[None]:
    """Time host<->device copies and synchronisations while the block runs (see the module's docstring)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    perf = time.perf_counter
    array_cls = _compat.array_class()
    original_block = jax.block_until_ready
    original_method = array_cls.__dict__["block_until_ready"]
    originals: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, replacement: Any) -> None:
        originals.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, replacement)

    def to_device(kind: str, call: Callable[[], Any], nbytes: Callable[[], int]) -> Any:
        if not recorder.timing_transfers() or _compat.in_host_callback():
            return call()
        started, compiled = perf(), recorder.eager_compile_s()
        with recorder.no_transfer_timing():
            result = call()
        with contextlib.suppress(Exception):  # the bookkeeping never fails the program's own call
            seconds = max(perf() - started - (recorder.eager_compile_s() - compiled), 0.0)
            recorder.add_transfer(kind, seconds, nbytes(), caller_user_frame(1), outside_call=True)
        return result

    def synced(kind: str, arrays: Any, read: Callable[[], Any], nbytes: Callable[[Any], int]) -> Any:
        """Wait for ``arrays`` (untimed calls may still run: that wait is the sync's), then ``read()`` (the copy);
        ``nbytes(result)``: what it copied. Called on every read: no context manager, one array waited for directly."""
        # Inside a host callback the running computation waits for the host: no sync of the program's.
        if not recorder.timing_transfers() or _compat.in_host_callback():
            return read()
        previous = recorder.enter_transfer()
        try:
            started = perf()
            if type(arrays) is array_cls:
                original_method(arrays)
            else:
                original_block(arrays)
            waited = perf()
            result = read()
        finally:
            recorder.leave_transfer(previous)
        with contextlib.suppress(Exception):  # as in to_device
            recorder.add_sync(kind, started, waited, perf(), nbytes(result))
        return result

    def copied(result: Any) -> int:
        return int(getattr(result, "nbytes", 0)) if isinstance(result, np.ndarray) else 0

    def nothing(result: Any) -> int:
        return 0

    home, attr = _compat.device_put_homes()[0]
    original_put = getattr(home, attr)

    @functools.wraps(original_put)
    def device_put(x: Any, *args: Any, **kwargs: Any) -> Any:
        return to_device("device_put", lambda: original_put(x, *args, **kwargs),
                         lambda: sum(v.nbytes for v in jax.tree_util.tree_leaves(x) if isinstance(v, np.ndarray)))

    def to_array(original: Callable) -> Callable:
        @functools.wraps(original)
        def convert(x: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(x, (np.ndarray, np.generic)) or _compat.under_transformation():
                return original(x, *args, **kwargs)  # not numpy, or a constant of a function being traced: no copy
            return to_device("jnp.asarray", lambda: original(x, *args, **kwargs), lambda: int(x.nbytes))

        return convert

    original_get = jax.device_get

    @functools.wraps(original_get)
    def device_get(x: Any) -> Any:
        return synced("device_get", x, lambda: original_get(x),
                      lambda got: sum(copied(v) for v in jax.tree_util.tree_leaves(got)))

    original_value = array_cls.__dict__["_value"]

    def value(self: Any) -> Any:
        if not _compat.host_copy_pending(self):
            return original_value.__get__(self)
        return synced(read_kind("host read"), self, lambda: original_value.__get__(self), copied)

    def numpy_reader(original: Callable) -> Callable:
        @functools.wraps(original)
        def read(a: Any, *args: Any, **kwargs: Any) -> Any:
            if type(a) is not array_cls:
                return original(a, *args, **kwargs)
            return synced(read_kind("np.asarray"), a, lambda: original(a, *args, **kwargs), copied)

        return read

    @functools.wraps(original_block)
    def block_until_ready(x: Any) -> Any:
        if not recorder.timing_transfers():
            return original_block(x)
        return synced("block_until_ready", x, lambda: x, nothing)

    def block_method(self: Any) -> Any:
        if not recorder.timing_transfers():  # jax.block_until_ready's own call, or the profile's
            return original_method(self)
        caller = sys._getframe(1).f_code.co_filename
        return synced(EQX_WAIT if caller.endswith(_EQX_JIT) else "block_until_ready", self, lambda: self, nothing)

    def wait(x: Any) -> Any:
        if type(x) is array_cls:  # jax's own method: nothing patched runs, nothing to mark
            return original_method(x)
        previous = recorder.enter_transfer()
        try:
            return original_block(x)
        finally:
            recorder.leave_transfer(previous)

    unpatched_wait = recorder.wait
    recorder.wait = wait  # the profile's own waits are not the program's syncs
    try:
        for module, attr in _compat.device_put_homes():
            patch(module, attr, device_put)
        patch(jnp, "asarray", to_array(jnp.asarray))
        patch(jnp, "array", to_array(jnp.array))
        patch(jax, "device_get", device_get)
        patch(array_cls, "_value", property(value))
        patch(np, "asarray", numpy_reader(np.asarray))
        patch(np, "array", numpy_reader(np.array))
        patch(jax, "block_until_ready", block_until_ready)
        patch(array_cls, "block_until_ready", block_method)
        yield
    finally:
        for owner, name, previous in reversed(originals):
            setattr(owner, name, previous)
        recorder.wait = unpatched_wait
