"""The jit layer's ahead-of-time path: ``jax.jit(f).lower(x).compile()`` and ``jax.jit(f).trace(x).lower().compile()``.

An instrumented function's ``.trace``/``.lower`` return a :class:`Staged` around jax's ``Traced``/``Lowered``
(every attribute passes through). Each stage files the compile spans jax reports while it runs (trace, lower,
backend compile), and ``.compile()`` tells every installed hook (:meth:`jaxdbg.jit_layer.JitHook.on_compile_ahead`)
with those spans, then returns an :class:`InstrumentedCompiled`: jax's ``Compiled`` behind the same call path as
the jitted function itself, with the same record (a function's calls are counted together, however they are
made). A hook that checks outputs gets the magnitudes from a reduction dispatched right after the call: the
user's executable runs as compiled (a companion with the check compiled in would be a second compile of the
whole program, which an ahead-of-time user compiled once on purpose).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg import jit_layer
    >>> class Seen(jit_layer.JitHook):
    ...     check_outputs = True
    ...     def on_compile_ahead(self, call):
    ...         print("compiled", call.function.name, sorted({stage for stage, _, _ in call.spans}))
    ...     def after(self, call, out):
    ...         print("call", call.index, call.host_magnitudes().tolist())
    >>> with jit_layer.installed(Seen()):
    ...     def scale(x, n):
    ...         return x * n
    ...     compiled = jax.jit(scale, static_argnums=1).lower(jnp.ones(2), 3).compile()
    ...     _ = compiled(jnp.array([1.0, -2.0]))
    compiled scale ['compile', 'lower', 'trace']
    call 0 [6.0]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from jaxdbg.jit_layer import FunctionRecord, InstrumentedJit, JitCall, _Layer


class Staged:
    """jax's ``Traced`` or ``Lowered`` of an instrumented function; its ``.lower()``/``.compile()`` are filed."""

    def __init__(self, function: InstrumentedJit, stage: Any, args: tuple, kwargs: dict,
                 spans: list[tuple[str, float, float]]):
        self._function = function
        self._stage = stage
        self._args = args
        self._kwargs = kwargs
        self._spans = spans  # of the stages so far

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``Traced.lower``: the Lowered, its lowering filed with the trace's."""
        spans = list(self._spans)
        with collecting(self._function._layer, spans):
            lowered = self._stage.lower(*args, **kwargs)
        return Staged(self._function, lowered, self._args, self._kwargs, spans)

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        """``Lowered.compile``: the Compiled, behind the hooks; the hooks are told of the compile (its stages)."""
        spans = list(self._spans)
        with collecting(self._function._layer, spans):
            compiled = self._stage.compile(*args, **kwargs)
        function = self._function
        layer = function._layer
        if not layer.hooks:  # the hooks left between lower() and compile()
            return compiled
        record = function.record
        call = JitCall(function, self._args, self._kwargs, record.calls)
        call.spans = spans
        call.notes.update(lowered=self._stage, compiled=compiled)
        if spans:  # nothing reported: jax answered from its caches, nothing compiled
            with layer.internal():
                for hook in list(layer.hooks):
                    hook.on_compile_ahead(call)
        return InstrumentedCompiled(layer, compiled, function, self._args, self._kwargs, record)

    def __getattr__(self, name: str) -> Any:
        if name in ("_stage", "_function"):
            raise AttributeError(name)
        return getattr(self._stage, name)

    def __repr__(self) -> str:
        return f"<jaxdbg-instrumented {self._stage!r}>"


class InstrumentedCompiled(InstrumentedJit):
    """jax's ``Compiled`` behind the hooks, as the jitted function it came from (same record, name, options). It
    is called with the dynamic arguments only (jax's ``Compiled`` takes no static ones), so ``fun`` is the user's
    function with the static arguments of the lowering bound (what a replay traces), and donated argument numbers
    count the dynamic arguments."""

    is_compiled = True

    def __init__(self, layer: _Layer, compiled: Any, function: InstrumentedJit, args: tuple, kwargs: dict,
                 record: FunctionRecord):
        numbers = sorted({i % len(args) for i in function.static_argnums if -len(args) <= i < len(args)})
        static_args = [(i, args[i]) for i in numbers]
        static_kwargs = {k: v for k, v in kwargs.items() if k in function.static_argnames}
        fun = _with_statics(function.fun, static_args, static_kwargs)
        options = {k: v for k, v in function.options.items() if k not in ("static_argnums", "static_argnames")}
        donated = _as_numbers(options.get("donate_argnums"), len(args))
        if donated:
            options["donate_argnums"] = tuple(d - sum(1 for i in numbers if i < d) for d in donated
                                              if d not in numbers)
        super().__init__(layer, compiled, fun, options, record)
        self.static_argnums, self.static_argnames = (), ()
        self.donates = function.donates

    def checked(self) -> Any:
        """The compiled call, then ``max(|x|)`` of its outputs in a reduction of jaxdbg's own (see the module)."""
        if self._checked is None:
            from jax.tree_util import tree_leaves

            from jaxdbg.nonfinite import device_magnitudes_jaxdbg

            compiled, local = self.jitted, self._layer.local

            def run(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
                out = compiled(*args, **kwargs)
                state = local.state
                spans, state.spans = state.spans, None  # the reduction's own compile is not the user's
                try:
                    return out, device_magnitudes_jaxdbg(tree_leaves(out))
                finally:
                    state.spans = spans

            self._checked = run
        return self._checked

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'Compiled' object has no attribute 'lower'")

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'Compiled' object has no attribute 'trace'")


@contextlib.contextmanager
def collecting(layer: _Layer, spans: list) -> Iterator[None]:
    """File the compile spans jax reports while the block runs into ``spans`` (as a call's, not as eager work)."""
    state = layer.local.state
    before = state.spans
    state.spans = spans
    state.depth += 1
    try:
        yield
    finally:
        state.depth -= 1
        state.spans = before


def _with_statics(fun: Any, static_args: list[tuple[int, Any]], static_kwargs: dict) -> Any:
    """``fun`` called with the dynamic arguments, the static ones put back where they were."""
    if not static_args and not static_kwargs:
        return fun

    def dynamic(*args: Any, **kwargs: Any) -> Any:
        full = list(args)
        for i, value in static_args:
            full.insert(i, value)
        return fun(*full, **kwargs, **static_kwargs)

    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(dynamic, attr, getattr(fun, attr))
    return dynamic


def _as_numbers(value: Any, count: int) -> list[int]:
    if value is None:
        return []
    values = (value,) if isinstance(value, int) else tuple(value)
    return sorted({v % count for v in values if count and -count <= v < count})
