"""The one place that patches ``jax.jit`` (and ``jax.pmap``): the instrumentation layer that every command plugs into.

While at least one :class:`JitHook` is installed (:func:`installed`, a context manager that restores
``jax.jit`` in ``finally``), ``jax.jit(fun, **options)`` returns an :class:`InstrumentedJit`. It behaves like
the jitted function (``.eval_shape`` and every other attribute pass through; ``.lower``/``.trace`` too, their
``.compile()`` behind the hooks: the ahead-of-time path below; it binds as a method), and each *top-level* call of it
(concrete arguments, not inside another trace, not inside another instrumented call or jaxdbg's own work) runs
through the installed hooks:

- ``on_jit(function)`` when ``jax.jit`` is applied;
- ``watches(function)``: which calls of it the hook sees, decided once per function (again after
  :func:`replan`): every call (the default), none, or those ``wants(function, index)`` accepts, asked per call
  (a hook that overrides ``wants`` is asked per call);
- ``around(call, run)``: by default ``before(call)``, then ``run()``, then ``after(call, out)`` or
  ``on_exception(call, err)``. ``before`` may replace ``call.args``/``call.kwargs``; a hook that must wrap
  the execution itself (a profiler annotation) overrides ``around``;
- ``on_unwanted_compile(call, out)``: a call the hook's ``wants`` declined compiled after all (its stages in
  ``call.spans``).

A call that no hook sees stays on jax's C++ dispatch with its count kept (and, while some hook samples calls,
its compile spans watched); the layer adds about a microsecond to it. Every call's compile spans (trace, lower,
backend compile, persistent-cache hits, reported by ``jax.monitoring`` while it runs) are in ``call.spans``.

``jax.pmap(fun, **options)`` is patched the same way and returns an :class:`InstrumentedPmap`, whose calls
reach only the hooks that set ``sees_pmap`` (profile's and ``jaxdbg.watch``'s): since jax 0.10 a pmap is a
``jax.jit`` of a ``shard_map`` built inside jax, invisible to the ``jax.jit`` patch, and a hook that replays
or checks a jitted function's outputs must know that its outputs hold every device's block (its replay
traces the pmap'd function as jax built it).

Hooks run in installation order, the first installed outermost. A hook that sets ``check_outputs`` gets
the one non-finite check of :mod:`jaxdbg.nonfinite`: the call runs a companion compiled function that
returns the outputs plus ``max(|x|)`` of each floating output leaf, in the same program (its name ends in
:data:`CHECKED_SUFFIX`), and ``call.host_magnitudes()`` copies just that vector. A pmap'd call gets the same
vector: its companion is a pmap of the same function that also returns a row of magnitudes per device, each over
its own blocks (:meth:`InstrumentedPmap.checked`), reduced over the devices on the host.

profile (timing and the compile split), nan-hunt and the in-process watch (non-finite outputs), and repro
(failures and captures) are hooks; none of them touches ``jax.jit`` itself.

Example:
    >>> import jax, jax.numpy as jnp
    >>> class Counting(JitHook):
    ...     check_outputs = True
    ...     def after(self, call, out):
    ...         print(call.function.name, call.index, call.host_magnitudes().tolist())
    >>> with installed(Counting()):
    ...     double = jax.jit(lambda x: 2 * x)
    ...     _ = double(jnp.array([1.0, -2.0]))
    ...     _ = double(jnp.array([3.0]))
    <lambda> 0 [4.0]
    <lambda> 1 [6.0]
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxdbg import _compat, frameworks
from jaxdbg._source import SourceLocation, caller_user_frame, is_user_file
from jaxdbg.frameworks import unwrap_function as unwrap_function
from jaxdbg.multihost_calls import HelperCall, called_label
from jaxdbg.nonfinite import over_devices, with_magnitudes

# Names the companion functions that also return the output magnitudes. It ends in "_jaxdbg", as every program
# of jaxdbg's own does (nan-hunt's eager check passes those by).
CHECKED_SUFFIX = "__checked_jaxdbg"
# jax.monitoring's compile spans, by the stage they time; a persistent-cache hit is filed as ("cache_hit", 0, 0).
COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_trace_state_clean = _compat.trace_state_clean


class JitHook:
    """Base class of the hooks: every method is a no-op. Subclasses override what they need."""

    check_outputs: bool = False  # read when a function's plan is made (see replan)
    sees_pmap: bool = False  # whether calls of pmap'd functions (InstrumentedPmap) run through this hook

    def watches(self, function: InstrumentedJit) -> bool | None:
        """Which calls of ``function`` this hook sees, asked once per function (again after :func:`replan`):
        True every call, False none, None those :meth:`wants` accepts (asked per call). The default: none of a
        pmap'd function unless the hook ``sees_pmap``; else every call, or per call when the hook overrides
        :meth:`wants`."""
        if function.is_pmap and not self.sees_pmap:
            return False
        return None if type(self).wants is not JitHook.wants else True

    def wants(self, function: InstrumentedJit, index: int) -> bool:
        """Whether this hook runs for call ``index`` of ``function`` (asked per call when :meth:`watches` says
        None). A call no hook wants goes straight to jax's C++ dispatch (its index still counts): a profiler
        that times one call in N costs nothing on the others."""
        return True

    def on_jit(self, function: InstrumentedJit) -> None:
        """``jax.jit`` was applied (once per application, before any call)."""

    def compiler_options(self) -> dict[str, Any] | None:
        """XLA options for the top-level calls of every function jitted while this hook is installed (``jax.jit``'s
        ``compiler_options``; the user's own win on a clash), e.g. memory's per-function buffer-assignment dump.
        Asked when ``jax.jit`` is applied, so they reach the user's functions alone, not eager operations; a call
        nested in another function's trace runs without them (jax refuses them there)."""
        return None

    def around(self, call: JitCall, run: Callable[[], Any]) -> Any:
        """Run one call; the default is ``before``, ``run()``, then ``after`` or ``on_exception``."""
        self.before(call)
        try:
            out = run()
        except BaseException as err:
            self.on_exception(call, err)
            raise
        self.after(call, out)
        return out

    def before(self, call: JitCall) -> None:
        """Before the call runs; may replace ``call.args`` and ``call.kwargs``."""

    def after(self, call: JitCall, out: Any) -> None:
        """After the call returned ``out`` (its computation may still be running on the device)."""

    def on_exception(self, call: JitCall, err: BaseException) -> None:
        """The call raised ``err`` (re-raised afterwards)."""

    def on_unwanted_compile(self, call: JitCall, out: Any) -> None:
        """A call that :meth:`wants` declined compiled: told once it returned ``out``, with its stages in
        ``call.spans`` and its start in ``call.started`` (``time.perf_counter()``)."""

    def on_compile_ahead(self, call: JitCall) -> None:
        """``jax.jit(f).lower(...).compile()`` (or ``.trace(...).lower().compile()``) compiled ahead of time (see
        the ahead-of-time path below): ``call.function`` is the jitted function, ``call.args``/``call.kwargs`` what it
        was lowered for, ``call.index`` its next call's, ``call.spans`` the stages of ``.trace``, ``.lower`` and
        ``.compile``, ``call.notes['lowered']``/``['compiled']`` jax's objects. Told as jaxdbg's own work. The
        Compiled's calls then reach the hooks as the function's own calls (``call.function.is_compiled``)."""


class FunctionRecord:
    """What is known of one jitted function across its ``jax.jit`` applications (same name and definition
    site): re-jitting the same code in a loop is still the same function to the user."""

    def __init__(self, ident: int, name: str, source: SourceLocation | None):
        self.id = ident
        self.name = name
        self.source = source  # where it is defined, or where it was jitted for code outside user files
        self.calls = 0  # top-level calls so far (read by other threads; the index comes from the counter)
        self.traced_by: str | None = None  # the latest transformation that traced it outside any top-level call
        self.counter = itertools.count()
        # Calls made through a transformation applied outside jit (``jax.grad(loss)(w)`` with ``loss`` jitted), per
        # transformation ('jax.grad', 'jax.vmap'), and the latest as (order among all such calls, transformation,
        # 0-based index among that transformation's calls): jax then runs ``loss``'s transformed program eagerly,
        # and nan-hunt's eager check names the call it belongs to by these.
        self.transformed_calls: dict[str, int] = {}
        self.latest_transformed: tuple[int, str, int] | None = None
        self.transformed_outer: str | None = None  # the function the latest transformation was given (``loss``)
        # Its output leaves, counted once at a call through jax.grad: the eager forward program jax.grad runs
        # returns these first, then the residuals only the backward pass reads.
        self.output_leaves: int | None = None
        # The jit of a multihost helper (jaxdbg.multihost_calls), named by the helper (``name``) at the user's line
        # (``source``): the argument that named its first call (a barrier's name), and a later one that differed.
        self.helper: str | None = None
        self.first_argument: str | None = None
        self.later_argument: str | None = None

    def note_helper_call(self, call: HelperCall) -> None:
        """File one call of a multihost helper at this record's line (its argument names the record's label)."""
        if self.helper is None:
            self.helper, self.first_argument = call.api, call.argument
        elif call.argument != self.first_argument:
            self.later_argument = call.argument

    @property
    def called_as(self) -> str | None:
        """A multihost helper's jit: the helper as the user called it at this line (``sync_global_devices('saved')``,
        see :func:`jaxdbg.multihost_calls.called_label`); None for any other function."""
        if self.helper is None:
            return None
        return called_label(self.helper, self.first_argument, self.later_argument)


def _output_leaves(jitted: Any, args: tuple, kwargs: dict) -> int | None:
    """How many leaves ``jitted(*args, **kwargs)`` returns (abstractly: traced, not run), or None if that fails."""
    import jax

    try:
        return len(jax.tree_util.tree_leaves(jax.eval_shape(jitted, *args, **kwargs)))
    except Exception:  # noqa: BLE001 - the count refines the forward/backward split only
        return None


_transformed_order = itertools.count()  # orders the transformed calls of all functions (FunctionRecord)


def note_transformed_call(record: FunctionRecord, transform: str, outer: str | None = None) -> None:
    """File a call of ``record``'s function traced by ``transform`` outside any top-level call (see
    :attr:`FunctionRecord.transformed_calls`); ``outer``: the function the transformation was given, where it is
    not this one (``loss`` of ``jax.grad(loss)`` calling the jitted ``layer``).

    Example:
        >>> record = FunctionRecord(0, "loss", None)
        >>> note_transformed_call(record, "jax.grad"); note_transformed_call(record, "jax.grad")
        >>> record.transformed_calls, record.latest_transformed[1:]
        ({'jax.grad': 2}, ('jax.grad', 1))
    """
    record.traced_by = transform
    record.transformed_outer = outer
    index = record.transformed_calls.get(transform, 0)
    record.transformed_calls[transform] = index + 1
    record.latest_transformed = (next(_transformed_order), transform, index)


class JitCall:
    """One top-level call of an instrumented function, as the hooks see it.

    ``index`` is the 0-based count of calls of this function (its record, across re-jits); ``notes`` is a
    place for hooks to keep what they need from ``before`` to ``after``. ``args``/``kwargs`` are emptied when
    the call returns: a hook that keeps the call longer (a check read late) keeps what it needs in ``notes``.
    ``spans``: the compile stages jax reported while the call ran, as ``(stage, start, end)`` with stage
    'trace', 'lower', 'compile' or 'cache_hit' (empty: it compiled nothing); ``check``: whether it runs the
    companion that also returns the output magnitudes.
    """

    __slots__ = ("_host", "_state", "args", "check", "function", "index", "kwargs", "magnitudes", "notes", "spans",
                 "started")

    def __init__(self, function: InstrumentedJit, args: tuple, kwargs: dict, index: int, check: bool = False,
                 state: _ThreadState | None = None):
        self._state = state if state is not None else function._layer.local.state  # the calling thread's
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self.index = index
        self.check = check
        self.magnitudes: Any = None  # device vector, when a hook asked for the check
        self.notes: dict[str, Any] = {}
        self.spans: list[tuple[str, float, float]] = []
        self.started = 0.0
        self._host: np.ndarray | None = None

    def host_magnitudes(self) -> np.ndarray:
        """``max(|x|)`` per floating output leaf, on the host (the only copy the check makes; waits for it)."""
        if self._host is None:
            host = np.zeros((0,), np.float32) if self.magnitudes is None else np.asarray(self.magnitudes)
            self._host = over_devices(host) if host.ndim == 2 else host  # a pmap'd call's: a row per device
        return self._host

    def use_host_magnitudes(self, host: np.ndarray) -> None:
        """Give the call its magnitudes already copied to the host (read with other calls' in one copy)."""
        self._host = host

    def run(self) -> Any:
        """Run the jitted function on ``args``/``kwargs`` (the innermost ``run`` the hooks are given)."""
        function = self.function
        state = self._state
        state.depth += 1  # as internal(), without a generator per call
        state.spans = self.spans  # the layer's listener files compile spans here; also marks the user's call
        self.started = time.perf_counter()
        try:
            run = function.top_level
            if self.check:
                run = function._checked  # as checked(), without a method call per call once it is built
                if run is None:
                    run = function.checked()
                out, self.magnitudes = run(*self.args, **self.kwargs) if self.kwargs else run(*self.args)
                return out
            return run(*self.args, **self.kwargs) if self.kwargs else run(*self.args)
        finally:
            state.spans = None
            state.depth -= 1


class _Plan:
    """Which installed hooks see which calls of one function, made once per layer epoch (see :func:`replan`),
    with what a call needs at hand (read as slots: the function's own attributes go through its
    ``__getattr__`` hook, slower on a path that runs on every call)."""

    __slots__ = ("active", "check", "epoch", "every", "jitted", "layer", "local", "nobody", "record", "sampled",
                 "top_level")

    def __init__(self, layer: _Layer, function: InstrumentedJit, epoch: int, every: tuple[JitHook, ...] = (),
                 sampled: tuple[JitHook, ...] = ()):
        self.layer = layer
        self.local = layer.local
        self.jitted = function.jitted  # what a nested call runs
        self.top_level = function.top_level  # what a top-level call runs (with the hooks' compiler options)
        self.record = function.record
        self.epoch = epoch
        self.active = bool(layer.hooks)
        self.every = every  # hooks that see every call
        self.sampled = sampled  # hooks asked per call (wants)
        self.nobody = not every and not sampled
        self.check = any(h.check_outputs for h in every)


class _ThreadState:
    """The layer's state on one thread: a plain object, reached once per call (``_PerThread().state``). An
    attribute of a ``threading.local`` costs ~4x one of this (the thread's own dict is found first), and a
    watched call read or wrote seven of them."""

    __slots__ = ("depth", "spans")

    def __init__(self) -> None:
        self.depth = 0  # inside an instrumented call or jaxdbg's own work
        self.spans: list | None = None  # the compile spans of the user's jitted call running now (None: none is)


class _PerThread(threading.local):
    """Each thread's :class:`_ThreadState`, as ``state`` (made at the thread's first use of it)."""

    def __init__(self) -> None:
        self.state = _ThreadState()


def _wrappers(fun: Callable) -> Iterator[Any]:
    """Each ``functools.wraps`` wrapper between a callable and its Python function, outermost first (partials
    looked through)."""
    for _ in range(8):
        if isinstance(fun, functools.partial):
            fun = fun.func
        elif hasattr(fun, "__wrapped__"):
            yield fun
            fun = fun.__wrapped__
        else:
            break


# jax's transformations whose wrapper is told by the local function jax defines for it (``grad.<locals>.grad_f``)
TRANSFORMS = frozenset({"grad", "value_and_grad", "vmap", "jacrev", "jacfwd", "checkpoint", "remat"})


def transform_name(wrapper: Any) -> str | None:
    """The jax transformation a ``functools.wraps`` wrapper is (one of :data:`TRANSFORMS`), read from the code of
    the local function jax defines for it (``grad.<locals>.grad_f``, held behind jax's traceback-filtering wrapper;
    its ``__qualname__`` is the user's, copied by ``functools.wraps``); None for any other wrapper.

    Example:
        >>> import jax
        >>> def loss(x):
        ...     return x * x
        >>> [transform_name(w) for w in _wrappers(jax.value_and_grad(loss))], transform_name(loss)
        (['value_and_grad'], None)
    """
    found = _transform_of(wrapper)
    return found[0] if found is not None else None


def _transform_of(wrapper: Any) -> tuple[str, Any] | None:
    """(:func:`transform_name`, the local function jax defined for it), or None."""
    code = getattr(wrapper, "__code__", None)
    if code is None or is_user_file(code.co_filename):
        return None
    for candidate in (wrapper, *_closed_over(wrapper)):
        qualname = getattr(getattr(candidate, "__code__", None), "co_qualname", "")
        outer = qualname.split(".<locals>.")[0] if ".<locals>." in qualname else ""
        if outer in TRANSFORMS:
            return outer, candidate
    return None


def _closed_over(fun: Any) -> list:
    """The values of ``fun``'s closure cells (one level; empty cells left out)."""
    return [cell.cell_contents for cell in getattr(fun, "__closure__", None) or () if _filled(cell)]


def _settings(fun: Any, depth: int = 3) -> tuple:
    """The plain values a transformation's local function closes over (``argnums``, ``has_aux``, ``in_axes``), and
    those of jax's functions it closes over (``grad_f`` calls a ``value_and_grad_f`` behind its traceback filter):
    ``jax.grad(loss, argnums=1)`` is another program than ``jax.grad(loss)``."""
    found: list = []
    for value in _closed_over(fun):
        if isinstance(value, (int, str, type(None))) or (
                isinstance(value, tuple) and all(isinstance(v, (int, str, type(None))) for v in value)):
            found.append(value)
        elif depth > 1 and callable(value) and not is_user_file(getattr(getattr(value, "__code__", None),
                                                                       "co_filename", "")):
            found.extend(_settings(value, depth - 1))
    return tuple(found)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _transforms(fun: Callable) -> tuple:
    """Each ``functools.wraps`` wrapper between a jitted callable and its Python function: the jax transformation it
    is (:func:`transform_name`), or the code of a user's decorator: the same for every re-jit of one transformed
    function, different for another transform of the same function (``jax.grad`` and ``jax.value_and_grad`` share
    jax's traceback-filtering wrapper: told apart by name).

    Example:
        >>> import jax
        >>> def loss(x):
        ...     return x * x
        >>> _transforms(loss), _transforms(jax.grad(loss)) == _transforms(jax.grad(loss))
        ((), True)
        >>> len({_transforms(jax.grad(loss)), _transforms(jax.value_and_grad(loss)), _transforms(jax.grad(loss, 1))})
        3
    """
    found: list[Any] = []
    for wrapper in _wrappers(fun):
        transform = _transform_of(wrapper)
        if transform is not None:
            found.append((transform[0], *_settings(transform[1])))
            continue
        code = getattr(wrapper, "__code__", None)  # another wrapper: its code, and the code of what it closes over
        found.append((code.co_filename, code.co_firstlineno) if code is not None else type(wrapper).__qualname__)
        found += [(held.__code__.co_filename, held.__code__.co_firstlineno) for held in _closed_over(wrapper)
                  if callable(held) and hasattr(held, "__code__")]
    return tuple(found)


class InstrumentedJit:
    """What ``jax.jit(fun, **options)`` returns while hooks are installed; behaves like the jitted function."""

    is_pmap = False
    is_compiled = False  # a InstrumentedCompiled: jax's Compiled of this function
    helper: HelperCall | None = None  # a multihost helper's jit: the call of the helper it was applied for

    def __init__(self, layer: _Layer, jitted: Any, fun: Callable, options: dict, record: FunctionRecord,
                 top_level: Any = None):
        self._layer = layer
        self.jitted = jitted
        # What a top-level call runs: ``jitted`` with the hooks' compiler options (JitHook.compiler_options).
        self.top_level = jitted if top_level is None else top_level
        self.fun = fun
        self.options = options
        self.record = record
        self.name = record.name
        # jax's own completed lists: a rebuilt twin (adopted) passes only the numbers, and a keyword argument
        # named by number (or a positional one named by name) is static all the same.
        statics = _compat.static_arguments(jitted)
        self.static_argnums: tuple = statics[0] if statics else _as_tuple(options.get("static_argnums"))
        self.static_argnames: tuple = statics[1] if statics else _as_tuple(options.get("static_argnames"))
        self._checked: Any = None
        self._plan = _Plan(layer, self, -1)
        # Whether a call may donate (delete) its argument buffers: asked on every watched call.
        self.donates = options.get("donate_argnums") is not None or options.get("donate_argnames") is not None
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(self, attr, getattr(jitted, attr))
        self.__wrapped__ = getattr(jitted, "__wrapped__", fun)

    def checked(self) -> Any:
        """The companion that also returns the output magnitudes, compiled with the same options. Given
        ``out_shardings`` (``nnx.jit`` always passes them), those describe the user's outputs: the companion's
        are ``(theirs, None)``, the small vector's sharding left to jax.

        In the same program on purpose: measured on a Flax NNX CNN loop on a 2-core CPU, a separate reduction
        dispatched after each call cost 4-7% of the step (a second dispatch, and a second program competing with
        the next step for the cores) against ~0% compiled in (XLA schedules it among the step's own work)."""
        if self._checked is None:
            options = dict(self.options)
            if options.get("out_shardings") is not None:
                options["out_shardings"] = (options["out_shardings"], None)
            self._checked = self._layer.real_jit(with_magnitudes(self.fun, self.name + CHECKED_SUFFIX), **options)
        return self._checked

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plan = self._plan
        layer = plan.layer
        if plan.epoch != layer.epoch:
            plan = layer.plan(self)
        if not plan.active or (state := plan.local.state).depth:
            return plan.jitted(*args, **kwargs)  # nested in a watched call, or jaxdbg's own
        if not _trace_state_clean():  # traced by a transformation applied outside any watched call
            transform = _compat.current_transform()
            note_transformed_call(plan.record, transform, _compat.transformed_function_name())
            if transform == "jax.grad" and plan.record.output_leaves is None:
                plan.record.output_leaves = _output_leaves(plan.jitted, args, kwargs)
            return plan.jitted(*args, **kwargs)
        if not layer.first_call_seen:
            layer.first_call()
        record = plan.record
        index = next(record.counter)
        record.calls = index + 1
        if plan.nobody:  # counted, and left on jax's C++ dispatch: nothing else runs
            return plan.top_level(*args, **kwargs) if kwargs else plan.top_level(*args)
        return layer.call(self, plan, index, args, kwargs, state)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """jax's ``lower``, its stages filed and its ``.compile()`` behind the hooks (the ahead-of-time path below)."""
        return self._ahead("lower", args, kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """jax's ``trace`` (where it has one), as :meth:`lower`."""
        return self._ahead("trace", args, kwargs)

    def _ahead(self, stage: str, args: tuple, kwargs: dict) -> Any:
        layer = self._layer
        if self.is_pmap or not layer.hooks or layer.local.state.depth or not _trace_state_clean():
            return getattr(self.jitted, stage)(*args, **kwargs)  # jaxdbg's own, or inside a trace: jax's own

        spans: list[tuple[str, float, float]] = []
        with collecting(layer, spans):
            staged = getattr(self.top_level, stage)(*args, **kwargs)  # with the hooks' compiler options
        return Staged(self, staged, args, kwargs, spans)

    def __getattr__(self, name: str) -> Any:
        if name in ("jitted", "_layer", "fun", "top_level"):  # not set yet (half-built, or unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.jitted, name)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<jaxdbg-instrumented {self.jitted!r}>"


class InstrumentedPmap(InstrumentedJit):
    """What ``jax.pmap(fun, **options)`` returns while a hook that ``sees_pmap`` is installed: the pmap'd
    function (``jitted``) behind the same call path as a jitted one, named after the user's ``fun``. Its static
    arguments are pmap's ``static_broadcasted_argnums``; its checked companion is a pmap too (:meth:`checked`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> class Seen(JitHook):
        ...     sees_pmap = True
        ...     def after(self, call, out):
        ...         print(call.function.name, call.function.is_pmap, out.shape)
        >>> with installed(Seen()):
        ...     def double(x):
        ...         return 2 * x
        ...     _ = jax.pmap(double)(jnp.ones((1, 3)))
        double True (1, 3)
    """

    is_pmap = True

    def __init__(self, layer: _Layer, mapped: Any, fun: Callable, options: dict, record: FunctionRecord):
        super().__init__(layer, mapped, fun, options, record)
        self.static_argnums = _as_tuple(options.get("static_broadcasted_argnums"))
        self.static_argnames = ()
        self.donates = bool(_as_tuple(options.get("donate_argnums")))

    def checked(self) -> Any:
        """The companion: pmap of the user's function returning its outputs plus :func:`jaxdbg.nonfinite.magnitudes`
        of its outputs, each device over its own blocks (``out_axes`` ``(theirs, 0)``: a row per device, reduced over
        the devices on the host by :meth:`JitCall.host_magnitudes`), in the same program, with the same options."""
        if self._checked is None:
            options = {**self.options, "out_axes": (self.options.get("out_axes", 0), 0)}
            self._checked = self._layer.real_pmap(with_magnitudes(self.fun, self.name + CHECKED_SUFFIX), **options)
        return self._checked


def main_thread_calls() -> tuple[str | None, int]:
    """``(the instrumented jitted function the program's main thread is calling now or None, the top-level
    calls made so far)``. Read by another thread (a heartbeat): nothing is recorded per call for it.

    Example:
        >>> main_thread_calls()[0] is None   # the main thread is here, in no jitted call
        True
    """
    layer = _layer
    total = sum(record.calls for record in list(layer.records.values())) if layer is not None else 0
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    code = InstrumentedJit.__call__.__code__
    while frame is not None:
        if frame.f_code is code:
            return str(getattr(frame.f_locals.get("self"), "name", "?")), total
        frame = frame.f_back
    return None, total


class _Layer:
    """The installed hooks and the functions jitted while they were installed."""

    def __init__(self, real_jit: Callable, real_pmap: Callable):
        self.real_jit = real_jit
        self.real_pmap = real_pmap
        self.hooks: list[JitHook] = []
        self.epoch = 0  # bumped when the hooks change: each function's plan is made again at its next call
        self.records: dict[tuple, FunctionRecord] = {}
        self.local = _PerThread()
        self.lock = threading.Lock()
        self.first_call_seen = False
        self.ran_ahead: Any = None  # the outputs of the latest call that no hook saw (see take_ran_ahead)

    def jit(self, fun: Callable | None = None, /, *args: Any, **options: Any) -> Any:
        if fun is None:  # @jax.jit(static_argnames=...) used as a decorator factory
            return lambda f: self.jit(f, *args, **options)
        jitted = self.real_jit(fun, *args, **options)
        if not self.hooks or not callable(jitted) or not hasattr(jitted, "lower"):
            return jitted
        helper = _compat.multihost_call(fun)  # jax's multihost helpers jit on every call: this one's
        wrapped = InstrumentedJit(self, jitted, fun, options, self._record(fun, helper=helper),
                                  self.top_level_jit(fun, args, options, jitted))
        wrapped.helper = helper
        for hook in list(self.hooks):
            hook.on_jit(wrapped)
        return wrapped

    def top_level_jit(self, fun: Callable, args: tuple, options: dict, jitted: Any) -> Any:
        """What top-level calls run: ``jitted`` again with the hooks' compiler options merged under the user's
        own (see JitHook.compiler_options), or ``jitted`` itself when no hook adds any."""
        extra: dict[str, Any] = {}
        for hook in self.hooks:
            extra.update(hook.compiler_options() or {})
        if not extra:
            return jitted
        merged = {**extra, **(options.get("compiler_options") or {})}
        return self.real_jit(fun, *args, **{**options, "compiler_options": merged})

    def pmap(self, fun: Callable, /, *args: Any, **options: Any) -> Any:
        mapped = self.real_pmap(fun, *args, **options)
        if args:  # pmap(fun, axis_name): the one positional option
            options = {"axis_name": args[0], **options}
        return self.instrumented_pmap(mapped, fun, options) or mapped

    def instrumented_pmap(self, mapped: Any, fun: Callable, options: dict) -> InstrumentedPmap | None:
        """``mapped`` (what the real ``jax.pmap(fun, **options)`` returned) behind the hooks that see pmap'd
        functions, or None when none of the installed hooks does."""
        hooks = [h for h in self.hooks if h.sees_pmap]
        if not hooks:
            return None
        wrapped = InstrumentedPmap(self, mapped, fun, options, self._record(fun, "pmap"))
        for hook in hooks:
            hook.on_jit(wrapped)
        return wrapped

    def _record(self, fun: Callable, kind: str = "jit", helper: HelperCall | None = None) -> FunctionRecord:
        if helper is not None:  # jax's _identity_fn behind every barrier: one record per helper and user line
            return self._helper_record(helper)
        fun = frameworks.user_function(fun)  # the user's function, not a framework wrapper's inner one
        name, source = function_identity(fun)
        inner = unwrap_function(fun)
        code = getattr(inner, "__code__", None)
        where = (code.co_filename, code.co_firstlineno) if code is not None else (id(inner),)
        key = (kind, name, *where, *_transforms(fun))  # jit(loss), jit(value_and_grad(loss)): two programs, two records
        with self.lock:
            record = self.records.get(key)
            if record is None:
                record = self.records[key] = FunctionRecord(len(self.records), name, source or caller_user_frame(1))
            return record

    def _helper_record(self, helper: HelperCall) -> FunctionRecord:
        site = helper.site
        key = ("multihost", helper.api, *((site.file, site.line) if site else ()))
        with self.lock:
            record = self.records.get(key)
            if record is None:
                record = self.records[key] = FunctionRecord(len(self.records), helper.api, site)
            record.note_helper_call(helper)
            return record

    def busy(self) -> bool:
        return self.local.state.depth > 0

    def plan(self, function: InstrumentedJit) -> _Plan:
        epoch = self.epoch
        every, sampled = [], []
        for hook in self.hooks:
            sees = hook.watches(function)
            if sees is None:
                sampled.append(hook)
            elif sees:
                every.append(hook)
        plan = function._plan = _Plan(self, function, epoch, tuple(every), tuple(sampled))
        return plan

    def first_call(self) -> None:
        """The first top-level call: the program has joined its job, if it has one (see :func:`on_first_call`)."""
        self.first_call_seen = True
        for action in tuple(_first_call_actions):
            action()

    def call(self, function: InstrumentedJit, plan: _Plan, index: int, args: tuple, kwargs: dict,
             state: _ThreadState) -> Any:
        hooks, check, sampled = plan.every, plan.check, plan.sampled
        declined: tuple[JitHook, ...] = ()
        if not hooks and len(sampled) == 1:  # one sampling hook alone (profile's): asked once, no tuple built
            if not sampled[0].wants(function, index):  # watched for a compile, nothing else
                return self.unseen(function, plan, index, args, kwargs, sampled, state)
            hooks, check = sampled, sampled[0].check_outputs
        else:
            for hook in sampled:  # (a loop, not generators: this runs on every call)
                if hook.wants(function, index):
                    hooks += (hook,)
                    check = check or hook.check_outputs
                else:
                    declined += (hook,)
            if not hooks:  # only sampling hooks, none of which wants it: watched for a compile, nothing else
                return self.unseen(function, plan, index, args, kwargs, declined, state)
        call = JitCall(function, args, kwargs, index, check, state)
        try:
            if len(hooks) == 1:
                out = hooks[0].around(call, call.run)
            else:
                run = call.run
                for hook in reversed(hooks[1:]):
                    run = functools.partial(hook.around, call, run)
                out = hooks[0].around(call, run)
            if declined and call.spans:
                for hook in declined:
                    hook.on_unwanted_compile(call, out)
            return out
        finally:  # a hook that keeps the call past its end keeps what it needs of them in its notes
            call.args, call.kwargs = (), {}

    def unseen(self, function: InstrumentedJit, plan: _Plan, index: int, args: tuple, kwargs: dict,
               declined: tuple, state: _ThreadState) -> Any:
        """A call that every hook declined: run as is, its compile spans gathered in case it compiles (then
        the hooks are told), its outputs kept until the next such call (:func:`take_ran_ahead`)."""
        spans: list[tuple[str, float, float]] = []
        state.spans = spans
        started = time.perf_counter()
        try:
            out = plan.top_level(*args, **kwargs) if kwargs else plan.top_level(*args)
        finally:
            state.spans = None
        self.ran_ahead = out
        if spans:
            call = JitCall(function, args, kwargs, index, state=state)
            call.spans, call.started = spans, started
            for hook in declined:
                hook.on_unwanted_compile(call, out)
        return out

    def on_span(self, event: str, start_time: float, end_time: float, **kwargs: str | int) -> None:
        spans = self.local.state.spans
        if spans is not None and event in COMPILE_EVENTS:
            spans.append((COMPILE_EVENTS[event], start_time, end_time))

    def on_event(self, event: str, **kwargs: str | int) -> None:
        spans = self.local.state.spans
        if spans is not None and event == CACHE_HIT_EVENT:
            spans.append(("cache_hit", 0.0, 0.0))

    @contextlib.contextmanager
    def internal(self) -> Iterator[None]:
        state = self.local.state
        state.depth += 1
        try:
            yield
        finally:
            state.depth -= 1


_layer: _Layer | None = None
_install_lock = threading.Lock()


@contextlib.contextmanager
def installed(hook: JitHook) -> Iterator[JitHook]:
    """Install ``hook``: functions jitted (or pmap'd) from now on are instrumented; ``jax.jit`` and ``jax.pmap``
    are restored when the last hook leaves. Hooks nest (profile's and a program's own ``jaxdbg.watch`` at once)."""
    import jax
    import jax.monitoring as monitoring

    global _layer
    with _install_lock:
        if _layer is None:
            _layer = _Layer(jax.jit, jax.pmap)
            jax.jit = _layer.jit
            monitoring.register_event_time_span_listener(_layer.on_span)
            monitoring.register_event_listener(_layer.on_event)
            jax.pmap = _layer.pmap  # type: ignore[assignment]  # forwards every argument to the real pmap
        layer = _layer
        layer.hooks = [*layer.hooks, hook]  # a new list: a call in flight keeps the hooks it started with
        layer.epoch += 1
    try:
        yield hook
    finally:
        with _install_lock:
            layer.hooks = [h for h in layer.hooks if h is not hook]
            layer.epoch += 1
            if not layer.hooks and _layer is layer:
                jax.jit = layer.real_jit
                monitoring.unregister_event_time_span_listener(layer.on_span)
                monitoring.unregister_event_listener(layer.on_event)
                jax.pmap = layer.real_pmap
                _layer = None


# Run once per installed layer, at the program's first top-level jitted call: by then the program has joined its
# jax.distributed job, if it has one. The job layer installs its command agreement here (multihost.agree_at_first_call).
_first_call_actions: list[Callable[[], None]] = []


def on_first_call(action: Callable[[], None]) -> None:
    """Run ``action`` at the program's first top-level jitted call under an installed hook (once per installation;
    an exception it raises comes out of that call). Installing the same action again changes nothing."""
    if action not in _first_call_actions:
        _first_call_actions.append(action)


def replan() -> None:
    """Ask every hook's :meth:`JitHook.watches` again at each function's next call (a hook whose answer, or
    whose ``check_outputs``, changed while installed calls this)."""
    layer = _layer
    if layer is not None:
        with _install_lock:
            layer.epoch += 1


# Framework wrappers that hold their inner ``jax.jit`` as an attribute: Flax's ``nnx.jit`` (``jitted_fn``; the
# user's function is ``fun``) and Equinox's ``filter_jit`` (``_cached``; ``__wrapped__``).
_INNER_JIT_ATTRIBUTES = ("jitted_fn", "_cached")


def user_namespaces() -> list[dict]:
    """The global namespaces of the program's own modules (not jax's, not jaxdbg's, not site-packages')."""
    return [module.__dict__ for module in list(sys.modules.values())
            if is_user_file(getattr(module, "__file__", None)) and isinstance(getattr(module, "__dict__", None), dict)]


@contextlib.contextmanager
def adopted() -> Iterator[list[str]]:
    """While hooks are installed, also instrument functions jitted *before* (``@jax.jit``, ``nnx.jit`` and
    ``eqx.filter_jit`` at module level, the usual way; ``jax.pmap`` too while a hook sees pmap'd functions): each
    one bound to a global name of one of the program's own modules is swapped for an instrumented twin built with
    the same options (for a framework wrapper, its inner ``jax.jit`` is), and everything is put back on exit.
    Instances of the program's own classes are searched too, those bound to a global name and those in the local
    variables of the program's frames that enter the block: ``self.step = jax.jit(self._step)`` in a trainer's
    ``__init__`` is swapped on the instance. Yields the names adopted. A function held only in a local variable
    cannot be reached (enter the watch before ``jax.jit`` for those), nor one pmap'd with both static and donated
    arguments.

    Example:
        >>> import jax, jax.numpy as jnp, os, sys, tempfile, types
        >>> program = types.ModuleType("program")
        >>> program.__file__ = os.path.join(tempfile.mkdtemp(), "program.py")
        >>> program.step = jax.jit(lambda x: x + 1)      # jitted before any hook, as at module level
        >>> sys.modules["program"] = program
        >>> class Count(JitHook):
        ...     def after(self, call, out):
        ...         print("watched call", call.index)
        >>> with installed(Count()), adopted() as names:
        ...     _ = program.step(jnp.ones(2))
        watched call 0
        >>> "step" in names, isinstance(program.step, InstrumentedJit)     # put back on exit
        (True, False)
        >>> del sys.modules["program"]
    """
    layer = _layer
    undo: list[tuple[Any, str, Any]] = []
    names: list[str] = []
    if layer is not None:
        namespaces = user_namespaces()
        for namespace in namespaces:
            for name, restore in _adopt_in(namespace, layer):
                undo.append(restore)
                names.append(name)
        for name, restore in _adopt_in_instances(_user_instances(namespaces, sys._getframe(2)), layer):
            undo.append(restore)
            names.append(name)
    try:
        yield names
    finally:
        for owner, name, original in reversed(undo):
            if isinstance(owner, dict):
                owner[name] = original
            elif isinstance(owner, type):
                setattr(owner, name, original)
            else:
                object.__setattr__(owner, name, original)


def _adopt_in(namespace: dict, layer: _Layer, owner: type | None = None) -> list[tuple[str, tuple[Any, str, Any]]]:
    """Swap the jitted functions bound in ``namespace`` (a module's globals, or with ``owner`` that class's
    attributes) for instrumented twins; ``(name, undo)`` for each. The classes a module defines are searched too: a
    ``jax.jit`` (or ``nnx.jit``, ``eqx.filter_jit``) applied to a method at class level is a class attribute, and
    the twin binds as a method just as jax's own object does."""
    done = []
    for name, value in list(namespace.items()):
        if isinstance(value, InstrumentedJit):
            continue
        if owner is None and isinstance(value, type) and value.__module__ == namespace.get("__name__"):
            done += _adopt_in(dict(vars(value)), layer, value)
            continue
        twin = _twin(layer, value, None)
        if twin is not None:
            if owner is None:
                namespace[name] = twin
            else:
                setattr(owner, name, twin)
            done.append((name, (namespace if owner is None else owner, name, value)))
            continue
        module = type(value).__module__ or ""
        if not module.startswith(("flax.", "equinox.")):
            continue
        for attribute in _INNER_JIT_ATTRIBUTES:
            inner = getattr(value, attribute, None)
            user = getattr(value, "fun", None) or getattr(value, "__wrapped__", None)
            twin = _twin(layer, inner, user) if inner is not None else None
            if twin is not None:
                object.__setattr__(value, attribute, twin)  # Equinox modules are frozen dataclasses
                done.append((name, (value, attribute, inner)))
    return done


def _user_instances(namespaces: list[dict], frame: Any) -> list[Any]:
    """Objects of the program's own classes (with an instance ``__dict__``) bound to a global name of its modules
    or to a local variable of its frames from ``frame`` outwards, each once."""
    candidates = [value for namespace in namespaces for value in list(namespace.values())]
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            candidates += list(frame.f_locals.values())
        frame = frame.f_back
    seen: set[int] = set()
    found = []
    for value in candidates:
        if id(value) in seen or isinstance(value, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(value))
        module = sys.modules.get(type(value).__module__)
        if is_user_file(getattr(module, "__file__", None)) and isinstance(getattr(value, "__dict__", None), dict):
            found.append(value)
    return found


def _adopt_in_instances(objects: list[Any], layer: _Layer) -> list[tuple[str, tuple[Any, str, Any]]]:
    """Swap the jitted functions held in the instance attributes of ``objects`` for instrumented twins."""
    done = []
    for obj in objects:
        for name, value in list(vars(obj).items()):
            twin = None if isinstance(value, InstrumentedJit) else _twin(layer, value, None)
            if twin is None:
                continue
            try:
                object.__setattr__(obj, name, twin)
            except (AttributeError, TypeError):  # a class that refuses new values: left as it is
                continue
            done.append((f"{type(obj).__name__}.{name}", (obj, name, value)))
    return done


def _twin(layer: _Layer, value: Any, user_fun: Any) -> InstrumentedJit | None:
    """An instrumented ``jax.jit`` (or ``jax.pmap``) of the same function with the same options, or None (not a
    jax.jit object nor a pmap'd function a hook sees, or options that cannot be carried over)."""
    rebuilt = _compat.jit_options(value)
    if rebuilt is None:
        seen = user_fun is None and any(hook.sees_pmap for hook in layer.hooks)
        rebuilt = _compat.pmap_options(value) if seen else None
        return layer.instrumented_pmap(layer.real_pmap(rebuilt[0], **rebuilt[1]), *rebuilt) if rebuilt else None
    fun, options = rebuilt
    jitted = layer.real_jit(fun, **options)
    record = layer._record(user_fun if user_fun is not None else fun)
    twin = InstrumentedJit(layer, jitted, fun, options, record, layer.top_level_jit(fun, (), options, jitted))
    for hook in list(layer.hooks):
        hook.on_jit(twin)
    return twin


@contextlib.contextmanager
def internal() -> Iterator[None]:
    """jaxdbg's own work (reference runs, replays, checks): instrumented functions called inside pass through
    untouched, and hooks that watch eager operations ignore them (see :func:`is_internal`)."""
    layer = _layer
    if layer is None:
        yield
        return
    with layer.internal():
        yield


def donates_arrays(call: Any) -> bool:
    """Whether ``call`` may delete an argument's buffers: its function donates and a donated argument holds a jax
    array. ``eqx.filter_jit`` jits with ``donate_argnums=0`` and puts nothing in that argument unless asked to donate:
    copying every input of every call then cost an Equinox loop ~2 ms per step for nothing."""
    import jax

    function = call.function
    if not function.donates:
        return False
    if function.options.get("donate_argnames") is not None:  # by name: not resolved here, so assumed
        return True
    args = call.args
    return any(isinstance(leaf, jax.Array) for i in _as_tuple(function.options.get("donate_argnums"))
               if -len(args) <= i < len(args) for leaf in jax.tree_util.tree_leaves(args[i]))


def device_copies(tree: Any) -> Any:
    """Device copies of the jax arrays in ``tree``, made as jaxdbg's own work: what a hook keeps of the inputs of a
    call that donates them (the call deletes the originals)."""
    import jax

    with internal():
        return jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, jax.Array) else x, tree)


def take_ran_ahead() -> Any:
    """The outputs of the latest call that sampling hooks let run ahead unseen (None if there is none since the
    last time this was asked): waiting for them waits for every call queued before. A hook that times a call
    waits for them first, so that its timing is the call's alone."""
    layer = _layer
    if layer is None:
        return None
    out, layer.ran_ahead = layer.ran_ahead, None
    return out


def in_user_call() -> bool:
    """True while an instrumented call runs the user's jitted function itself (not jaxdbg's own work)."""
    layer = _layer
    return layer is not None and layer.local.state.spans is not None


def is_internal() -> bool:
    """True inside :func:`internal` or inside an instrumented call on this thread."""
    layer = _layer
    return layer is not None and layer.busy()


def function_identity(fun: Any) -> tuple[str, SourceLocation | None]:
    """A function's display name and where it is defined (None for code outside user files).

    Example:
        >>> function_identity(functools.partial(len))
        ('len', None)
    """
    inner = unwrap_function(fun)
    name = getattr(inner, "__name__", None) or type(inner).__name__
    code = getattr(inner, "__code__", None)
    if code is not None and is_user_file(code.co_filename):
        # jax.jit(jax.value_and_grad(loss)) is `value_and_grad(loss)`: another program than jax.jit(loss)
        shown = name
        for transform in reversed([t for t in map(transform_name, _wrappers(fun)) if t]):
            shown = f"{transform}({shown})"
        return shown, SourceLocation(code.co_filename, code.co_firstlineno, name)
    transformed = _transformed_user_function(inner)
    if transformed is not None:  # jax.jit(checkify.checkify(step)): `checkify(step)`, at step's line
        transform, user = transformed
        user_name, source = function_identity(user)
        return f"{transform}({user_name})", source
    return name, None


def parameter_function(fun: Any) -> Any:
    """The function whose parameters name a call's positional arguments: ``fun`` unwrapped or, for the wrapper a
    jax transformation returns (``checkify.checkify(step)`` takes ``*args, **kwargs`` and passes them on), the
    user's function inside it, so that they read ``params``, ``batch`` rather than ``args[0]``.

    Example:
        >>> def step(params, batch): ...
        >>> parameter_function(functools.partial(step)) is step
        True
    """
    import inspect

    inner = unwrap_function(fun)
    try:
        params = inspect.signature(inner).parameters.values()
    except (TypeError, ValueError):
        return inner
    if any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return inner
    transformed = _transformed_user_function(inner)
    return transformed[1] if transformed is not None else inner


def _transformed_user_function(inner: Any) -> tuple[str, Any] | None:
    """``(transform, user function)`` when ``inner`` is the wrapper a jax transformation returns around a user's
    function (``checkify.checkify(step)`` is jax's ``checkify.<locals>.checked_fun``, a name the user never
    wrote and that two checkified functions would share), else None."""
    code = getattr(inner, "__code__", None)
    qualname = getattr(inner, "__qualname__", "")
    if code is None or is_user_file(code.co_filename) or ".<locals>." not in qualname:
        return None
    for cell in getattr(inner, "__closure__", None) or ():
        try:
            held = unwrap_function(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
        held_code = getattr(held, "__code__", None)
        if callable(held) and held_code is not None and is_user_file(held_code.co_filename):
            return qualname.split(".<locals>.")[0].rsplit(".", 1)[-1], held
    return None


def _as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, (int, str)) else tuple(value)


# ---- The ahead-of-time path ----------------------------------------------------------------------------------
# The jit layer's ahead-of-time path: ``jax.jit(f).lower(x).compile()`` and ``jax.jit(f).trace(x).lower().compile()``.
#
# An instrumented function's ``.trace``/``.lower`` return a :class:`Staged` around jax's ``Traced``/``Lowered``
# (every attribute passes through). Each stage files the compile spans jax reports while it runs (trace, lower,
# backend compile), and ``.compile()`` tells every installed hook (:meth:`jaxdbg.jit_layer.JitHook.on_compile_ahead`)
# with those spans, then returns an :class:`InstrumentedCompiled`: jax's ``Compiled`` behind the same call path as
# the jitted function itself, with the same record (a function's calls are counted together, however they are
# made). A hook that checks outputs gets the magnitudes from a reduction dispatched right after the call: the
# user's executable runs as compiled (a companion with the check compiled in would be a second compile of the
# whole program, which an ahead-of-time user compiled once on purpose).


class Staged:
    """jax's ``Traced`` or ``Lowered`` of an instrumented function; its ``.lower()``/``.compile()`` are filed.

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
