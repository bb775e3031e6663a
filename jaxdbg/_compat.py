"""Every touch of jax internals and every jax version difference lives here, and only here.

jaxdbg supports jax 0.10 (Python 3.11) and jax 0.11 (Python 3.12). jax 0.11 merged ``ClosedJaxpr`` into
``Jaxpr`` (``ClosedJaxpr`` is an alias there and ``.jaxpr`` returns the object itself), so code that
needs "the equations and the constants" asks :func:`open_jaxpr` instead of touching attributes.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x: jnp.log(x) * 2)(1.0)
    >>> jaxpr, consts = open_jaxpr(closed)
    >>> [eqn.primitive.name for eqn in jaxpr.eqns]
    ['log', 'mul']
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
from jax._src import config as _jax_config  # internal: the x64 state as a value, without the Config lookup
from jax._src import core as _jax_core  # internal: trace_state_clean has no public spelling in jax 0.10/0.11

from jaxdbg import multihost_calls
from jaxdbg._source import SourceLocation, caller_user_frame, is_user_file
from jaxdbg.multihost_calls import HelperCall

JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__[:2])


def open_jaxpr(closed: Any) -> tuple[Any, list]:
    """``(jaxpr, consts)`` of a closed jaxpr on any supported jax version (an open jaxpr gets no consts)."""
    consts = list(getattr(closed, "consts", None) or [])
    inner = getattr(closed, "jaxpr", closed)
    return inner, consts


def source_frames(source_info: Any) -> Iterator[SourceLocation]:
    """User frames of an equation's traceback, innermost first, with jax and jaxdbg frames left out."""
    from jax._src import source_info_util  # internal: the only public route is a private helper

    traceback = getattr(source_info, "traceback", None)
    for frame in source_info_util.user_frames(traceback):
        if is_user_file(frame.file_name):
            yield SourceLocation(frame.file_name, frame.start_line, frame.function_name)


def eqn_source(eqn: Any) -> SourceLocation | None:
    """The innermost user line that created a jaxpr equation, or None if none is known."""
    return next(source_frames(eqn.source_info), None)


def eqn_callers(eqn: Any) -> tuple[str, ...]:
    """The qualified names of the functions on the Python stack that created a jaxpr equation (library ones
    included: ``clip_by_global_norm.<locals>.update_fn``), innermost first."""
    frames = getattr(getattr(eqn.source_info, "traceback", None), "frames", None) or ()
    return tuple(str(frame.function_name) for frame in frames)


def eqn_name_stack(eqn: Any) -> str:
    """The equation's name stack as text, e.g. ``'jvp(loss)'`` or ``'transpose(jvp(loss))'``."""
    return str(getattr(eqn.source_info, "name_stack", ""))


# --- repro: cutting and emitting jaxprs (jaxdbg.repro, jaxdbg.jaxpr.emit) ---------------------------------

# Primitives that only call another jaxpr: evaluating the inner jaxpr gives the same values.
_INLINABLE_PARAMS = {
    "pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat2": "jaxpr", "checkpoint": "jaxpr", "remat": "jaxpr",
    "eval_jaxpr": "call_jaxpr",  # jax 0.11: lax.custom_root's gradient calls it
}


def inlined_call(eqn: Any) -> tuple[Any, list] | None:
    """``(jaxpr, operands)``: the jaxpr an equation merely calls (jit, custom_jvp/vjp, remat, closed_call) and the
    equation's operands it is called on, else None. A ``custom_linear_solve`` (``jnp.linalg.solve``,
    ``jax.scipy.linalg.solve``) computes its value by its ``solve`` jaxpr on that jaxpr's constants and the
    right-hand side, as its own evaluation rule does (the matvec and the transposes serve differentiation)."""
    operands = list(eqn.invars)
    if eqn.primitive.name == "custom_linear_solve":
        lengths, solve = eqn.params["const_lengths"], eqn.params["jaxprs"].solve
        start = lengths.matvec + lengths.vecmat
        return solve, operands[start:start + lengths.solve] + operands[sum(lengths):]
    key = _INLINABLE_PARAMS.get(eqn.primitive.name)
    if key is None:
        return None
    called = eqn.params.get(key) or eqn.params.get("fun_jaxpr")
    count = len(open_jaxpr(called)[0].invars)
    return called, operands[len(operands) - count:]  # (it takes the equation's last operands)


def is_literal(atom: Any) -> bool:
    """True for a jaxpr literal (a constant written in the equation) or any atom carrying ``val``."""
    from jax.extend.core import Literal

    return isinstance(atom, Literal) or (hasattr(atom, "val") and not hasattr(atom, "count"))


def is_drop_var(atom: Any) -> bool:
    """True for an output the jaxpr discards (printed ``_``)."""
    return type(atom).__name__ == "DropVar"


def scan_split(params: dict) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a scan: jax 0.10 names them; jax 0.11 packs the groups in a FlatTree
    ``ft_in`` (iterating it gives leaves, so the groups are read with ``unpack``)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()  # (consts, carry, xs)
    return len(list(consts)), len(list(carry))


def is_extended_dtype(dtype: Any) -> bool:
    """PRNG key arrays and other dtypes numpy cannot hold."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


# ---- profile (issue 3): jit-call tracking, transfer timing, compiled-executable analyses ----------------


def under_transformation() -> bool:
    """True while any jax trace is active (inside jit tracing, grad, vmap): calls there are not executions."""
    return not _jax_core.trace_state_clean()


_TRACE = _jax_core.trace_state_strong_ref  # the trace in effect on this thread (jax's config value)
_AXIS_ENV = _jax_core.axis_env_state
_EVAL_TRACE, _TOP_AXIS_ENV = _jax_core.eval_trace, _jax_core.top_axis_env
_NO_TRACE_IS_CLEAN = hasattr(_jax_core.TracingContext, "is_empty")  # jax 0.11: an unset trace counts as clean


def trace_state_clean() -> bool:
    """``jax._src.core.trace_state_clean()``, asked on every instrumented call: the same two config values read
    directly (jax's own goes through two properties, ~1.2 us a call against ~0.3 us).

    Example:
        >>> trace_state_clean() == _jax_core.trace_state_clean()
        True
    """
    trace = _TRACE.value
    if trace is None:
        return _NO_TRACE_IS_CLEAN
    return trace is _EVAL_TRACE and _AXIS_ENV.value is _TOP_AXIS_ENV


# jax's trace types, by what a user applied to get them (jax 0.10/0.11: grad and linearize trace with LinearizeTrace).
_TRANSFORMS = {"LinearizeTrace": "jax.grad", "JVPTrace": "jax.jvp", "BatchTrace": "jax.vmap",
               "DynamicJaxprTrace": "a function traced outside the watch (jax.jit, lax.scan, jax.eval_shape)"}


def current_transform() -> str:
    """What is tracing the code running now, in the user's words ('jax.grad', 'jax.vmap', ...): asked when a
    jitted function is called inside a transformation that jaxdbg did not apply (the call itself never runs).

    Example:
        >>> jax.vmap(lambda x: [current_transform()] and x)(jax.numpy.ones(2)) is not None
        True
        >>> seen = []
        >>> _ = jax.grad(lambda x: seen.append(current_transform()) or x * 2.0)(1.0)
        >>> seen
        ['jax.grad']
    """
    trace = _TRACE.value
    name = type(trace).__name__
    return _TRANSFORMS.get(name, f"a jax transformation ({name})")


# The closures jax's transformations return (jax/_src/api.py, jax 0.10/0.11); each holds the user's function as `fun`.
_TRANSFORM_CLOSURES = ("value_and_grad_f", "vmap_f", "jacfun")


def transformed_function_name() -> str | None:
    """The name of the function the innermost transformation running now was given: ``loss`` inside
    ``jax.grad(loss)(w)`` (read from the frame of jax's closure on the stack); None where none is found.

    Example:
        >>> def loss(x):
        ...     seen.append(transformed_function_name())
        ...     return x * 2.0
        >>> seen = []
        >>> _ = jax.grad(loss)(1.0)
        >>> seen
        ['loss']
    """
    api = os.path.join("jax", "_src", "api.py")
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _TRANSFORM_CLOSURES and code.co_filename.endswith(api):
            with contextlib.suppress(Exception):  # f_locals of a jax frame: best effort
                fun = frame.f_locals.get("fun")
                while isinstance(fun, functools.partial):
                    fun = fun.func
                name = getattr(fun, "__name__", None)
                return name if isinstance(name, str) else None
            return None
        frame = frame.f_back
    return None


def backend_started() -> bool:
    """True once jax has started a backend (anything that asks for devices does). Until then jaxdbg must not
    start one itself: a multi-process program calls ``jax.distributed.initialize()`` first, and that call
    fails once a backend exists."""
    from jax._src import xla_bridge  # internal: no public "is the backend up?" in jax 0.10/0.11

    return bool(xla_bridge._backends)


def add_xla_flags_at_backend_start(extra: str) -> None:
    """Append ``extra`` XLA flags to ``XLA_FLAGS`` when jax starts its first backend (XLA reads the variable
    then), leaving out any flag the program's own ``XLA_FLAGS`` already names. Setting them in the child's
    environment up front would make a script's ``os.environ.setdefault("XLA_FLAGS", ...)`` (the usual way to
    ask for several CPU devices) a no-op, and the program would run differently under jaxdbg."""
    import os

    from jax._src import xla_bridge  # internal: no public hook runs just before a backend starts

    def add() -> None:
        own = os.environ.get("XLA_FLAGS", "")
        named = {flag.split("=", 1)[0] for flag in own.split()}
        added = [flag for flag in extra.split() if flag.split("=", 1)[0] not in named]
        if added:
            os.environ["XLA_FLAGS"] = " ".join([own, *added]).strip()

    start = getattr(xla_bridge, "_init_backend", None)
    if start is None:  # a jax without that internal: the flags go in now (a program's setdefault then loses)
        add()
        return

    def init_backend(platform: str) -> Any:
        add()
        return start(platform)

    xla_bridge._init_backend = init_backend


def in_host_callback() -> bool:
    """True inside a host callback that a running compiled computation made (``jax.pure_callback``,
    ``io_callback``, ``jax.debug.print``/``callback``): jax enters each through a ``_wrapped_callback`` of its
    ``callback.py`` (jax 0.10 and 0.11). The device waits for such code, not the other way round.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> seen = []
        >>> def host(x):
        ...     seen.append(in_host_callback())
        ...     return np.asarray(x)
        >>> _ = jax.jit(lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct((2,), x.dtype), x))(jnp.ones(2))
        >>> seen, in_host_callback()
        ([True], False)
    """
    import sys

    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrapped_callback" and code.co_filename.endswith(_CALLBACK_FILE):
            return True
        frame = frame.f_back
    return False


_CALLBACK_FILE = os.path.join("jax", "_src", "callback.py")


def detected_cluster() -> str | None:
    """The cluster launcher whose environment this process runs in (``slurm``, ``ompi``), by environment
    variables alone: jax's detection of TPU and Kubernetes clusters asks metadata servers, which can hang."""
    from jax._src import clusters  # internal: jax's cluster detection has no public spelling

    for env in clusters.ClusterEnv._cluster_types:
        if env.name in ("slurm", "ompi") and env.is_env_present():
            return str(env.name)
    return None


def coordinator_address() -> str | None:
    """The coordinator this process joined (``jax.distributed.initialize``), or None."""
    from jax._src import distributed

    return distributed.global_state.coordinator_address


def distributed_client() -> Any:
    """The ``jax.distributed`` coordination-service client of this process, or None outside a job."""
    from jax._src import distributed  # internal: the key-value store has no public spelling in jax 0.10/0.11

    return distributed.global_state.client


def array_class() -> Any:
    """The concrete class of jax arrays (``ArrayImpl``), whose ``_value`` copies device data to the host.

    Typed Any: the caller patches that private property, which jax's types do not let one assign."""
    from jax._src.array import ArrayImpl

    return ArrayImpl


def host_copy_pending(array: Any) -> bool:
    """True when reading ``array`` on the host will copy it from the device (no cached host copy yet)."""
    return getattr(array, "_npy_value", None) is None


def device_put_homes() -> list[tuple[Any, str]]:
    """Every ``(module, attribute)`` holding ``device_put``: ``jax.device_put`` and the one ``jnp.asarray``
    calls (``jax._src.api.device_put``)."""
    from jax._src import api

    return [(jax, "device_put"), (api, "device_put")]


def pmap_input_sharding(options: dict, shape: tuple) -> Any:
    """The sharding ``jax.pmap(fun, **options)`` gives a numpy argument of ``shape`` mapped over its axis 0
    (jax 0.10/0.11 build pmap as a jit of a shard_map over a one-axis mesh of the first local devices, named by
    ``axis_name`` or jax's internal default), so that an argument put there first is not copied again inside the
    call; None where pmap would choose otherwise (explicit devices, several processes, more rows than devices).

    Example:
        >>> pmap_input_sharding({"axis_name": "batch"}, (1, 3)).spec == jax.sharding.PartitionSpec("batch")
        True
    """
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if options.get("devices") is not None or not shape or jax.process_count() > 1:
        return None
    devices = jax.local_devices(backend=options.get("backend"))
    if not 0 < shape[0] <= len(devices):
        return None
    axis = options.get("axis_name")
    axis = "_internal_pmap_axis_name" if axis is None else axis
    return NamedSharding(Mesh(np.array(devices[:shape[0]]), (axis,)), PartitionSpec(axis))


def compiled_cost(compiled: Any) -> dict[str, float] | None:
    """``Compiled.cost_analysis()`` as one flat dict (older jax returned a list of dicts; -1 means unknown)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost:
        return None
    return {k: float(v) for k, v in cost.items() if isinstance(v, (int, float)) and v >= 0}


def compiled_memory(compiled: Any, with_peak: bool = False) -> dict[str, int] | None:
    """``Compiled.memory_analysis()`` as ``{argument_bytes, output_bytes, temp_bytes, code_bytes, alias_bytes}``
    (with ``with_peak``, also ``peak_bytes``: its ``peak_memory_in_bytes``, which the CPU backend underreports)."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if stats is None:
        return None
    names = {"argument_bytes": "argument_size_in_bytes", "output_bytes": "output_size_in_bytes",
             "temp_bytes": "temp_size_in_bytes", "code_bytes": "generated_code_size_in_bytes",
             "alias_bytes": "alias_size_in_bytes"}
    if with_peak:
        names["peak_bytes"] = "peak_memory_in_bytes"
    return {k: int(getattr(stats, v)) for k, v in names.items() if getattr(stats, v, None) is not None}


# ---- nan-hunt (issue 4): equation evaluation, eager-op hooks, custom_vjp backward sources, shard_map ----



def is_batched_cond_select(eqn: Any) -> bool:
    """Whether a ``select_n`` equation is a ``lax.cond``/``lax.switch`` that vmap turned into a select (its
    predicate differs between batch elements, so every branch is computed and one result kept per element).

    Nothing in the equation says so but its traceback: jax's cond batching rule made it (checked on jax
    0.10.2 and 0.11.2, where the rule is ``_cond_batching_rule`` in ``lax/control_flow/conditionals.py``).
    """
    if eqn.primitive.name != "select_n":
        return False
    frames = getattr(getattr(eqn.source_info, "traceback", None), "frames", None) or ()
    return any(frame.function_name.startswith("_cond_batching_rule")
               and frame.file_name.replace("\\", "/").endswith("control_flow/conditionals.py") for frame in frames)


def bind_eqn(eqn: Any, invals: list, keep_source: bool = False) -> list:
    """Evaluate one equation on ``invals`` (concrete values, or tracers while retracing); always a list.

    ``keep_source=True`` re-binds under the equation's own traceback and name stack, so a jaxpr traced from
    this evaluation keeps the user's source lines (what ``jax.core.eval_jaxpr`` does).
    """
    from jax._src import source_info_util

    params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(params, tuple):  # older jax: (subfuns, params)
        subfuns, params = params
        invals = [*subfuns, *invals]
    ctx = getattr(getattr(eqn, "ctx", None), "manager", None) or contextlib.nullcontext()
    where: contextlib.AbstractContextManager[Any]
    if keep_source:
        stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        where = source_info_util.user_context(eqn.source_info.traceback, name_stack=stack)
    else:
        where = contextlib.nullcontext()
    with where, ctx:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def has_inner_jaxprs(eqn: Any) -> bool:
    """True for a higher-order equation (its params hold jaxprs: jit, scan, cond, custom_vjp, ...)."""
    from jax.extend.core import jaxprs_in_params

    return next(iter(jaxprs_in_params(eqn.params)), None) is not None


@contextlib.contextmanager
def custom_vjp_backward_sources() -> Iterator[None]:
    """While active, equations traced from a user's ``custom_vjp`` backward rule keep the rule's own lines.

    jax transposes a custom_vjp by calling the user's ``bwd`` under the *forward* call's traceback, so
    every equation of the rule would point at the line that called the function. Inside this context the
    rule runs under the live traceback instead, and its name stack gains ``custom_vjp_bwd(<rule name>)``.
    Restored in ``finally``; nothing else changes.
    """
    from jax._src import source_info_util
    from jax._src.interpreters import ad

    tables = [t for t in (getattr(ad, "primitive_transposes", None), getattr(ad, "fancy_transposes", None))
              if t is not None and ad.custom_lin_p in t]
    saved = [(table, table[ad.custom_lin_p]) for table in tables]

    def live_traceback(rule: Any) -> Any:
        def transpose(*args: Any, **kwargs: Any) -> Any:
            bwd = kwargs.get("bwd")
            name = getattr(getattr(bwd, "debug_info", None), "func_name", None) or getattr(bwd, "__name__", "bwd")
            stack = source_info_util.current_name_stack().extend(f"custom_vjp_bwd({name})")
            state = source_info_util._source_info_context
            saved_info = state.context
            state.context = source_info_util.SourceInfo(None, stack)  # no traceback: jax takes the live one
            try:
                return rule(*args, **kwargs)
            finally:
                state.context = saved_info
        return transpose

    for table, rule in saved:
        table[ad.custom_lin_p] = live_traceback(rule)
    try:
        yield
    finally:
        for table, rule in saved:
            table[ad.custom_lin_p] = rule


@contextlib.contextmanager
def eager_hooks(on_primitive: Any, on_jit: Any, keep_fast: Any) -> Iterator[None]:
    """Callbacks after every eager (top-level, concrete) execution, restored in ``finally``:

    - ``on_primitive(primitive, args, params, out, nested)`` for a primitive run op by op;
    - ``on_jit(name, closed_jaxpr, args, outs, nested)`` for a jitted function run through Python dispatch.

    jax's C++ dispatch skips Python once a call has been cached, and jax's own ``jnp`` functions are jitted,
    so eager ``jnp.sqrt(x)`` would be invisible: while active, new cache entries of top-level jitted calls get
    no fast path unless ``keep_fast(executable_name)`` (e.g. ``'jit(train_step)'``) says so. Entries cached
    before stay fast: clear jax's caches on entry (and on exit, so later calls get the fast path back).
    ``nested`` is True inside another eager execution (jax runs an eager primitive as a tiny jitted
    function; that inner call is nested, and keeps its fast path).
    """
    import threading

    from jax._src import core, pjit

    original_primitive = core.EvalTrace.process_primitive
    original_jit = pjit._pjit_call_impl_python
    original_fastpath = pjit._get_fastpath_data
    depth = threading.local()

    def process_primitive(self: Any, primitive: Any, args: Any, params: Any, /) -> Any:
        level = getattr(depth, "level", 0)
        depth.level = level + 1
        try:
            out = original_primitive(self, primitive, args, params)
        finally:
            depth.level = level
        if level > 0:
            on_primitive(primitive, args, params, out, True)
            return out
        # jax 0.11 runs process_primitive with no current trace (0.10: the eval trace); the hook replays the
        # operation (binds), which needs this trace current again.
        with core.set_current_trace(self):
            on_primitive(primitive, args, params, out, False)
        return out

    def call_impl_python(*args: Any, **params: Any) -> Any:
        level = getattr(depth, "level", 0)
        depth.level = level + 1
        try:
            result = original_jit(*args, **params)
        finally:
            depth.level = level
        on_jit(params.get("name"), params.get("jaxpr"), args, list(result[0]), level > 0)
        return result

    def fastpath_data(executable: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(getattr(executable, "unsafe_call", None), "name", "") or ""
        if getattr(depth, "level", 0) > 0 or keep_fast(name):
            return original_fastpath(executable, *args, **kwargs)
        return None

    core.EvalTrace.process_primitive = process_primitive  # type: ignore[method-assign]  # patched while active
    pjit._pjit_call_impl_python = call_impl_python
    pjit._get_fastpath_data = fastpath_data
    try:
        yield
    finally:
        core.EvalTrace.process_primitive = original_primitive  # type: ignore[method-assign]  # restored
        pjit._pjit_call_impl_python = original_jit
        pjit._get_fastpath_data = original_fastpath


def current_source_context() -> tuple[SourceLocation | None, str]:
    """``(user line, name stack)`` jax would give an equation created right now (e.g. an eager op).

    While jax transposes (eager ``grad``), the traceback is the forward line being differentiated.
    """
    from jax._src import source_info_util

    info = source_info_util.current()
    return next(source_frames(info), None), str(info.name_stack)


# jax.pmap runs as a jit of this name around a shard_map of the user's function (jax 0.10 and 0.11): seen by the
# eager hook, such a call is a pmap.
PMAP_JIT_NAME = "_fun"


def x64_enabled() -> bool:
    """Whether ``jax_enable_x64`` is on here and now (a ``jax.enable_x64`` block included): ~0.1 us."""
    return bool(_jax_config.enable_x64.value)


def is_pmapped(value: Any) -> bool:
    """Whether ``value`` is what ``jax.pmap(f)`` returned: a plain function defined in jax's pmap module (not
    jaxdbg's instrumented twin of one, which passes its attributes through)."""
    if not isinstance(value, types.FunctionType):
        return False
    code = value.__code__
    return code is not None and code.co_filename.replace("\\", "/").endswith("jax/_src/pmap.py")


def pmap_options(pmapped: Any) -> tuple[Any, dict] | None:
    """``(fun, options)`` that rebuild what ``jax.pmap(fun, **options)`` returned earlier (read from the closure
    of jax's pmap wrapper, jax 0.10/0.11), or None when it is no such function, or its options cannot be carried
    over (donated and static arguments at once: jax keeps the donated positions renumbered). Used to watch
    functions pmap'd before a ``jaxdbg.watch`` began.

    Example:
        >>> fun, options = pmap_options(jax.pmap(lambda x, n: x * n, "batch", static_broadcasted_argnums=1))
        >>> options["axis_name"], options["static_broadcasted_argnums"], options["in_axes"]
        ('batch', (1,), 0)
    """
    fun = getattr(pmapped, "__wrapped__", None)
    infer = _closure_values(pmapped).get("infer_params") if is_pmapped(pmapped) else None
    cells = _closure_values(infer) if infer is not None else {}
    needed = ("axis_name", "static_broadcasted_tuple", "donate_tuple", "in_axes", "out_axes_flat", "out_axes_tree",
              "devices", "backend", "axis_size")
    if fun is None or any(name not in cells for name in needed):
        return None
    statics, donated = tuple(cells["static_broadcasted_tuple"]), tuple(cells["donate_tuple"])
    if statics and donated:
        return None
    axis_name = cells["axis_name"]
    return fun, {"axis_name": None if axis_name == "_internal_pmap_axis_name" else axis_name,
                 "in_axes": cells["in_axes"],
                 "out_axes": jax.tree_util.tree_unflatten(cells["out_axes_tree"], cells["out_axes_flat"]),
                 "static_broadcasted_argnums": statics, "devices": cells["devices"], "backend": cells["backend"],
                 "axis_size": cells["axis_size"], "donate_argnums": donated}


def _closure_values(function: Any) -> dict[str, Any]:
    code, closure = getattr(function, "__code__", None), getattr(function, "__closure__", None) or ()
    values = {}
    for name, cell in zip(code.co_freevars if code is not None else (), closure):
        with contextlib.suppress(ValueError):  # a cell not filled yet
            values[name] = cell.cell_contents
    return values


def pmap_body(closed: Any) -> Any:
    """The jaxpr of a traced call of a pmap'd function, without pmap's own jit around it: the body of that jit
    (a shard_map of the user's function, as the eager hook sees a pmap), or ``closed`` itself when it is not a
    lone call of that jit on the call's own inputs and outputs."""
    jaxpr, _ = open_jaxpr(closed)
    if len(jaxpr.eqns) != 1:
        return closed
    eqn = jaxpr.eqns[0]
    body = eqn.params.get("jaxpr")
    if (eqn.primitive.name not in ("jit", "pjit") or eqn.params.get("name") != PMAP_JIT_NAME or body is None
            or list(eqn.invars) != list(jaxpr.invars) or list(eqn.outvars) != list(jaxpr.outvars)):
        return closed
    return body


def shard_map_layout(params: dict) -> tuple[dict[str, int], tuple, tuple, tuple[str, ...]] | None:
    """``(mesh axis sizes, in_specs, out_specs, manual axes in mesh order)`` of a shard_map, or None."""
    mesh = params.get("mesh")
    in_specs, out_specs = params.get("in_specs"), params.get("out_specs")
    if mesh is None or in_specs is None or out_specs is None:
        return None
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes if hasattr(mesh, "axis_sizes") else mesh.devices.shape))
    manual = params.get("newly_manual_axes", params.get("manual_axes", frozenset(sizes)))
    if params.get("auto"):
        manual = frozenset(sizes) - frozenset(params["auto"])
    return sizes, tuple(in_specs), tuple(out_specs), tuple(a for a in sizes if a in manual)


def pallas_whole_kernel(params: dict) -> Any | None:
    """A ``pallas_call``'s kernel as a pure closed jaxpr, ``(*inputs, *outputs) -> (*inputs, *outputs)`` (the
    values its refs hold after it ran), when one program sees every array whole: no grid (or a grid of one),
    every block the whole array, no scalar-prefetch or scratch operands, no aliasing. Otherwise None."""
    mapping, kernel = params.get("grid_mapping"), params.get("jaxpr")
    if mapping is None or kernel is None or params.get("input_output_aliases"):
        return None
    if any(int(n) != 1 for n in mapping.grid) or mapping.num_index_operands or mapping.num_scratch_operands:
        return None
    for block in mapping.block_mappings:
        shape = tuple(getattr(d, "block_size", d) for d in block.block_shape)
        if shape != tuple(block.array_aval.shape) or tuple(block.transforms):
            return None
    return _discharged(kernel)


def _discharged(kernel: Any) -> Any:
    """A kernel's jaxpr with its refs discharged: a pure closed jaxpr from the refs' values before to after."""
    from jax._src.state.discharge import discharge_state  # internal: refs -> values has no public spelling
    from jax.extend.core import ClosedJaxpr

    opened, consts = open_jaxpr(kernel)
    if JAX_VERSION < (0, 11):  # jax 0.10 discharges a closed jaxpr, jax 0.11 an open one
        return discharge_state(ClosedJaxpr(opened, consts))
    # an open jaxpr on jax 0.11 (typed closed after jax 0.10); its values' types without the refs' memory space,
    # as interpret mode strips it (a kernel traced again, in a compiled loop, is refused it)
    discharged: Any = discharge_state(opened, strip_memory_space=True)  # type: ignore[call-arg,unused-ignore]
    return ClosedJaxpr(discharged, consts)


class PallasGrid(NamedTuple):
    """A gridded ``pallas_call`` to replay program by program, as interpret mode runs it: its discharged
    ``kernel`` (refs in order: scalar prefetch, inputs, outputs, scratch), the ``grid``, per operand (inputs, then
    outputs) its block as sliced (a squeezed dimension is 1) and the ``squeezed`` dimensions the kernel does not
    see, the ``mappings`` that give each program's block offsets, how many scalar-prefetch operands come first
    (``scalars``) and scratch buffers last (``scratch``), and ``aliases`` (output -> the input it starts as)."""

    kernel: Any
    grid: tuple[int, ...]
    blocks: tuple[tuple[int, ...], ...]
    squeezed: tuple[tuple[bool, ...], ...]
    mappings: tuple[Any, ...]
    scalars: int = 0
    scratch: int = 0
    aliases: tuple[tuple[int, int], ...] = ()

    def starts(self, ids: Sequence[Any], scalars: Sequence[Any]) -> list[list[Any]]:
        """Per operand, the element offsets of program ``ids``'s block (its index map, scalar-prefetch values
        read). Works on tracers too."""
        return [list(m.compute_start_indices_interpret(tuple(ids), *scalars)) for m in self.mappings]


def pallas_grid_kernel(params: dict) -> PallasGrid | None:
    """A ``pallas_call`` over a static grid whose operands are blocks (squeezed dimensions allowed; partial edge
    blocks too, padded as interpret mode pads them), with scalar-prefetch, scratch and aliased operands: what a
    replay needs to run each program on its blocks. None for element-indexed or bounded dimensions, block
    transforms, vmapped or dynamic grids."""
    mapping, kernel = params.get("grid_mapping"), params.get("jaxpr")
    if mapping is None or kernel is None:
        return None
    if getattr(mapping, "vmapped_dims", ()) or getattr(mapping, "num_dynamic_grid_bounds", 0) \
            or not all(isinstance(n, int) for n in mapping.grid) or getattr(mapping, "local_grid_env", None):
        return None
    blocks, squeezed = [], []
    for block in mapping.block_mappings:
        kinds = [type(d).__name__ for d in block.block_shape]
        if tuple(block.transforms) or any(k not in ("Blocked", "Squeezed") for k in kinds) \
                or len(kinds) != len(block.array_aval.shape):
            return None
        blocks.append(tuple(int(d.block_size) if k == "Blocked" else 1 for d, k in zip(block.block_shape, kinds)))
        squeezed.append(tuple(k == "Squeezed" for k in kinds))
    from jax._src.pallas import core as pallas_core  # internal: the grid that `pl.program_id` is traced in

    with pallas_core.tracing_grid_env(tuple(mapping.grid), ()):  # program ids stay equations, read per program
        discharged = _discharged(kernel)
    aliases = tuple((int(o), int(i)) for i, o in params.get("input_output_aliases") or ())
    return PallasGrid(discharged, tuple(mapping.grid), tuple(blocks), tuple(squeezed),
                      tuple(mapping.block_mappings), int(mapping.num_index_operands),
                      int(mapping.num_scratch_operands), aliases)


@contextlib.contextmanager
def pallas_program(ids: Sequence[Any], grid: Sequence[int]) -> Iterator[None]:
    """While tracing a kernel's program: ``pl.program_id``/``pl.num_programs`` read ``ids`` and ``grid``."""
    from jax._src.pallas import core as pallas_core  # internal: interpret mode's own grid environment

    with pallas_core.grid_env(tuple(pallas_core.GridAxis(i, n) for i, n in zip(ids, grid))):
        yield


def jaxpr_function_name(closed: Any) -> str | None:
    """The name of the Python function a jaxpr was traced from (``debug_info.func_name``), if recorded."""
    inner = getattr(closed, "jaxpr", closed)
    info = getattr(inner, "debug_info", None)
    name = getattr(info, "func_name", None)
    return name if name and not name.startswith("<") else None


def jaxpr_from_jax(closed: Any) -> bool:
    """Whether a jaxpr was traced from one of jax's own functions (e.g. ``jnp.linalg.solve``), read from
    ``debug_info.func_src_info`` (``'solve at .../jax/_src/numpy/linalg.py:1379'``); False when not recorded."""
    inner = getattr(closed, "jaxpr", closed)
    where = getattr(getattr(inner, "debug_info", None), "func_src_info", None)
    if not where or " at " not in where:
        return False
    real = os.path.realpath(where.rsplit(" at ", 1)[1].rsplit(":", 1)[0])
    return real.startswith(_JAX_ROOT)


_JAX_ROOT = os.path.realpath(os.path.dirname(jax.__file__)) + os.sep


# ---- profile (issue 3), continued ------------------------------------------------------------------------


def profiler_start_homes() -> list[tuple[Any, str]]:
    """Every ``(module, attribute)`` holding ``start_trace``: the public one and the one ``jax.profiler.trace``
    calls internally."""
    from jax._src import profiler

    return [(jax.profiler, "start_trace"), (profiler, "start_trace")]


def device_memory_stats(device: Any) -> dict | None:
    """``device.memory_stats()``, or None where the backend keeps none (CPU) or raises instead."""
    try:
        return device.memory_stats() or None
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        return None


def jit_static_argnums(fn: Any, count: int) -> frozenset[int]:
    """Positions (0-based, of ``count`` positional arguments) that ``jax.jit(fn, static_argnums=...)`` treats
    as static; empty for a plain function. A ``Compiled`` object takes only the other arguments."""
    info = getattr(fn, "_jit_info", None)
    nums = tuple(getattr(info, "static_argnums", ()) or ())
    return frozenset(n % count for n in nums if -count <= n < count)


@contextlib.contextmanager
def custom_jvp_rule_sources() -> Iterator[None]:
    """While active, a user's ``custom_jvp`` rule traced from a staged jaxpr (under ``jax.checkpoint``) keeps
    the rule's own lines.

    jax evaluates a staged jaxpr equation by equation under each equation's traceback, so a custom_jvp rule
    first traced there (the jvp of a ``remat``) would point at the line that called the function. Inside this
    context the rule is traced under the live traceback instead (the name stack is unchanged). Restored in
    ``finally``; nothing else changes.
    """
    from jax._src import linear_util as lu
    from jax._src import source_info_util
    from jax._src.custom_derivatives import custom_jvp_call_p

    own = vars(custom_jvp_call_p).get("get_bind_params")
    original = custom_jvp_call_p.get_bind_params

    def live_traceback(rule_fun: Any) -> Any:
        def traced(*args: Any) -> Any:
            state = source_info_util._source_info_context
            saved_info = state.context
            state.context = source_info_util.SourceInfo(None, saved_info.name_stack)  # jax takes the live one
            try:
                return rule_fun.call_wrapped(*args)
            finally:
                state.context = saved_info
        return lu.wrap_init(traced, debug_info=rule_fun.debug_info)

    def get_bind_params(params: dict) -> Any:
        if "jvp_jaxpr_fun" in params:
            params = {**params, "jvp_jaxpr_fun": live_traceback(params["jvp_jaxpr_fun"])}
        return original(params)

    custom_jvp_call_p.get_bind_params = get_bind_params  # type: ignore[method-assign]  # patched while active
    try:
        yield
    finally:
        if own is None:
            del custom_jvp_call_p.get_bind_params
        else:
            custom_jvp_call_p.get_bind_params = own  # type: ignore[method-assign]  # restored


def static_arguments(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """``(static_argnums, static_argnames)`` of a ``jax.jit`` object as jax completed them (each derived from the
    other through the function's signature), or None for another callable. A static argument given by number
    and passed by keyword, or the other way round, is static to jax all the same.

    Example:
        >>> static_arguments(jax.jit(lambda x, mode="add": x, static_argnames="mode"))
        ((1,), ('mode',))
    """
    info = getattr(jitted, "_jit_info", None)  # private: jax keeps the completed lists there
    if info is None or not hasattr(info, "static_argnums") or not hasattr(info, "static_argnames"):
        return None
    return tuple(info.static_argnums), tuple(info.static_argnames)


def jit_options(jitted: Any) -> tuple[Any, dict] | None:
    """``(fun, options)`` that rebuild a ``jax.jit`` object made earlier (read from its private ``_fun`` and
    ``_jit_info``), or None when it is no such object or uses options this cannot carry over (explicit
    layouts, a device or backend). Used to watch functions jitted before a ``jaxdbg.watch`` began.

    Example:
        >>> f = jax.jit(lambda x, n: x * n, static_argnums=1, donate_argnums=0)
        >>> fun, options = jit_options(f)
        >>> {name: options[name] for name in ("static_argnums", "donate_argnums")}
        {'static_argnums': (1,), 'donate_argnums': (0,)}
    """
    info, fun = getattr(jitted, "_jit_info", None), getattr(jitted, "_fun", None)
    if info is None or fun is None or not hasattr(info, "in_shardings_treedef"):
        return None
    if info.device is not None or info.backend is not None or any(
            leaf is not None for leaf in (*info.in_layouts_leaves, *info.out_layouts_leaves)):
        return None
    options: dict[str, Any] = {}
    for name in ("static_argnums", "donate_argnums"):
        if getattr(info, name):
            options[name] = tuple(getattr(info, name))
    if info.static_argnames and not info.static_argnums:  # names alone: jax derives the numbers again
        options["static_argnames"] = tuple(info.static_argnames)
    if info.donate_argnames and not info.donate_argnums:
        options["donate_argnames"] = tuple(info.donate_argnames)
    from jax._src.sharding_impls import UnspecifiedValue

    for side in ("in", "out"):
        leaves = getattr(info, f"{side}_shardings_leaves")
        if any(not isinstance(leaf, UnspecifiedValue) for leaf in leaves):
            treedef = getattr(info, f"{side}_shardings_treedef")
            options[f"{side}_shardings"] = jax.tree_util.tree_unflatten(treedef, leaves)
    if info.keep_unused:
        options["keep_unused"] = True
    if info.inline:
        options["inline"] = True
    if info.compiler_options_kvs:
        options["compiler_options"] = dict(info.compiler_options_kvs)
    return fun, options


# jax logs an exception raised inside a host callback (``logger.exception`` in each callback primitive's impl)
# while it passes: the one moment the user's host function, the arguments it got and the frames of the raise
# are alive (XLA then turns the exception into a JaxRuntimeError that carries only its text).
HOST_CALLBACK_LOGGERS = ("jax._src.debugging", "jax._src.callback")
_CALLBACK_IMPLS = {"debug_callback_impl": "jax.debug.callback", "pure_callback_impl": "jax.pure_callback",
                   "io_callback_impl": "io_callback"}


def host_callback_call(tb: Any) -> dict | None:
    """What a failed host callback was called with, read off the traceback jax logged: ``kind`` (how the user
    called it: ``jax.debug.callback``, ``jax.pure_callback`` or ``io_callback``), the user's ``function``,
    ``args`` and ``kwargs`` as it received them, ``result_avals`` (pure/io) and ``ordered``; None when the
    traceback is not one of a callback impl's.

    Example:
        >>> import logging
        >>> seen = []
        >>> handler = logging.Handler(); handler.emit = lambda r: seen.append(host_callback_call(r.exc_info[2]))
        >>> logging.getLogger(HOST_CALLBACK_LOGGERS[0]).addHandler(handler)
        >>> logging.getLogger(HOST_CALLBACK_LOGGERS[0]).propagate = False
        >>> def log(step):
        ...     raise KeyError("accuracy")
        >>> try:
        ...     jax.jit(lambda s: jax.debug.callback(log, s))(5)
        ... except Exception:
        ...     pass
        >>> logging.getLogger(HOST_CALLBACK_LOGGERS[0]).propagate = True
        >>> logging.getLogger(HOST_CALLBACK_LOGGERS[0]).removeHandler(handler)
        >>> seen[0]["kind"], seen[0]["function"] is log, [int(a) for a in seen[0]["args"]]
        ('jax.debug.callback', True, [5])
    """
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if not frames or frames[0].f_code.co_name not in _CALLBACK_IMPLS:
        return None
    caller = frames[0].f_back  # the lowering's closure: the primitive's params
    outer = caller.f_locals if caller is not None else {}
    found = {"kind": _CALLBACK_IMPLS[frames[0].f_code.co_name],
             "result_avals": list((outer.get("params") or {}).get("result_avals") or ()),
             "ordered": bool(outer.get("ordered", False))}
    for frame in frames[1:]:
        local = frame.f_locals
        if frame.f_code.co_name == "_flat_callback" and "args_" in local:  # jax.debug.callback's flattening
            return {**found, "function": local.get("callback"), "args": tuple(local["args_"]),
                    "kwargs": dict(local.get("kwargs_") or {})}
        if frame.f_code.co_name == "__call__" and hasattr(local.get("self"), "callback_func"):  # _FlatCallback
            return {**found, "function": local["self"].callback_func, "args": tuple(local.get("args") or ()),
                    "kwargs": dict(local.get("kwargs") or {})}
    return None


# ---- hang-hunt (issue 20): a program's devices, calls into host callbacks ---------------------------------


def program_devices(compiled: Any) -> tuple:
    """The devices of a compiled program in the order its HLO numbers them (a collective's
    ``replica_groups`` with global device ids index this tuple); () where no sharding says.

    Example:
        >>> compiled = jax.jit(lambda x: x + 1).lower(jax.numpy.ones(2)).compile()
        >>> program_devices(compiled) == (jax.devices()[0],)
        True
    """
    shardings = [*jax.tree_util.tree_leaves(getattr(compiled, "input_shardings", None)),
                 *jax.tree_util.tree_leaves(getattr(compiled, "output_shardings", None))]
    for sharding in shardings:
        devices = getattr(sharding, "_device_assignment", None)  # private: the order the partitioner used
        if devices:
            return tuple(devices)
    return ()


# The functions a compiled program calls back into Python through for each kind of host callback: the lowering
# looks them up by name when the callback runs, so a wrapper put there sees every call (eager ones too).
_CALLBACK_HOMES = (("jax._src.callback", "pure_callback_impl", "jax.pure_callback"),
                   ("jax._src.callback", "io_callback_impl", "io_callback"),
                   ("jax._src.debugging", "debug_callback_impl", "jax.debug.callback"))


def callback_function(callback: Any) -> Any:
    """The user's function behind the flattened callback jax hands its callback impls."""
    inner = getattr(callback, "callback_func", None)  # pure_callback / io_callback: _FlatCallback
    if inner is not None:
        return inner
    code = getattr(callback, "__code__", None)  # jax.debug.callback: a closure over the user's function
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(callback, "__closure__", None) or ()):
        if name == "callback":
            with contextlib.suppress(ValueError):
                return cell.cell_contents
    return callback


@contextlib.contextmanager
def host_callback_hooks(enter: Any, leave: Any) -> Iterator[None]:
    """While active, ``token = enter(kind, function)`` runs before each call into a host callback (on the
    thread that runs it) and ``leave(token, error_or_None)`` after it; restored in ``finally``.

    Example:
        >>> seen = []
        >>> with host_callback_hooks(lambda kind, fn: seen.append((kind, fn.__name__)), lambda token, err: None):
        ...     def log(x):
        ...         pass
        ...     jax.jit(lambda x: jax.debug.callback(log, x))(1.0)
        >>> seen
        [('jax.debug.callback', 'log')]
    """
    import importlib

    from jax._src import debugging

    saved: list[tuple[Any, str, Any]] = []

    def wrap(original: Any, kind: str) -> Any:
        def recorded(*args: Any, callback: Any, **params: Any) -> Any:
            token = enter(kind, callback_function(callback))
            try:
                out = original(*args, callback=callback, **params)
            except BaseException as err:
                leave(token, err)
                raise
            leave(token, None)
            return out
        return recorded

    for module_name, name, kind in _CALLBACK_HOMES:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
        saved.append((module, name, original))
        setattr(module, name, wrap(original, kind))
    primitive = debugging.debug_callback_p  # jit's lowering of jax.debug.callback calls the primitive's impl
    saved.append((primitive, "impl", primitive.impl))
    primitive.impl = wrap(primitive.impl, "jax.debug.callback")  # type: ignore[method-assign]  # restored below
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


# jax.experimental.multihost_utils's helpers jit small functions of their own (``_identity_fn``, ``_psum``) on every
# call; the helper the user called is read from the stack while jax.jit is applied inside it (jaxdbg.multihost_calls).
_MULTIHOST_FILE = os.path.join("jax", "experimental", "multihost_utils.py")


def multihost_call(fun: Any) -> HelperCall | None:
    """For ``fun`` jitted by one of jax's multihost helpers, the call of it the user's code made (the outermost
    helper on the current stack, its barrier's name, the user's line that called it); None for any other function.

    Example:
        >>> multihost_call(len) is None
        True
    """
    if getattr(fun, "__module__", None) != multihost_calls.MODULE:
        return None
    frame: types.FrameType | None = sys._getframe(1)
    found = None
    while frame is not None:
        code = frame.f_code
        if code.co_name in multihost_calls.HELPERS and code.co_filename.endswith(_MULTIHOST_FILE):
            found = frame
        frame = frame.f_back
    if found is None:
        return None
    api = found.f_code.co_name
    argument = repr(found.f_locals.get("name")) if api == "sync_global_devices" else None
    return HelperCall(api, argument, caller_user_frame(2))
