"""Watch a running program for the first call whose outputs hold a NaN/Inf, cheaply.

While a :class:`Watch` is active (a context manager; everything is restored in ``finally``):

- it is a hook of :mod:`jaxdbg.jit_layer` that asks for the output check: every call of a function jitted
  meanwhile runs a companion compiled function that returns the user's outputs *plus* one small vector, the
  largest magnitude of every floating output leaf (``max(|x|)``, in the same program; a NaN or Inf anywhere
  shows up in it). Only that vector crosses to the host. It also feeds the growth tracker.
- every primitive jax runs eagerly (outside jit) has its outputs checked; one that *creates* a non-finite
  value from clean inputs is itself the origin.
- the arguments of a jitted call that no watched call returned (made by eager code, such as an optimiser
  update applied outside jit, or fresh data) get their ``max(|x|)`` too, for the growth tracker: an eager
  training loop that diverges shows in its parameters, not in any jitted output.

The inputs of each call are kept (references; donated arguments are copied on the device first), so the
failing call can be replayed exactly. At the first non-finite call the watch raises
:class:`NonFiniteFound` (a ``BaseException``, so the program's own ``except Exception`` does not swallow it).

With ``after_inf`` set, an Inf does not end the run: the contract's origin is the first NaN when the program
makes one, and an overflow is usually followed by one (inf - inf, 0 * inf) a few steps later. The watch then
keeps running for up to ``after_inf`` more jitted calls, records every call or eager operation that makes a
new Inf, and follows which arrays hold those infinities (by identity, through eager code and jitted calls), so
the NaN's finding says which of the recorded Infs fed it (``feeds``). Without a NaN, the first Inf is the
finding.

Example:
    >>> import jax, jax.numpy as jnp
    >>> with Watch() as watch:
    ...     step = jax.jit(lambda x: jnp.log(x))
    ...     step(jnp.array(-1.0))
    Traceback (most recent call last):
    ...
    jaxdbg.nan.watch.NonFiniteFound: call 0 of <lambda> returned non-finite ...
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import functools
import itertools
import linecache
import sys
import time
import types
import weakref
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten, tree_leaves

from jaxdbg import _compat, _malloc, jit_layer
from jaxdbg._source import SourceLocation, caller_user_frame, is_user_file
from jaxdbg.jit_layer import InstrumentedJit, JitCall, JitHook
from jaxdbg.nan.calls import Call, output_leaf_names
from jaxdbg.nan.eager_growth import EagerUpdates
from jaxdbg.nan.growth import GrowthTracker
from jaxdbg.nan.result import Origin, OriginKind
from jaxdbg.nan.stats import is_inexact, nonfinite_flags, value_stats
from jaxdbg.nonfinite import device_magnitudes_jaxdbg, flags_and_magnitude, over_devices, stacked_jaxdbg

# With ``read_late``, calls whose flags are not read yet. A finished call's flags are read at the next call;
# the inputs of the others are held by jax's own queue anyway. Past this many (the program runs far ahead of
# the device) the oldest is waited for. Calls that donate keep device copies of their inputs: at most this many.
MAX_PENDING = 64
MAX_PENDING_COPIES = 2
# Unread calls are read this many at a time once that many have finished: one vectorised check of their flags
# and growth instead of a read per call (a tiny function's call costs microseconds; a read costs ~20-60 us
# whatever its size). Finished calls wait for a batch no longer than READ_EVERY_S (a NaN is reported that late at
# most), a quarter of that once the unread calls keep READ_KEPT_BYTES of inputs (each unread call of a training
# step keeps the model before it). Flax NNX MLP loop (0.7-0.9 ms steps, 0.5 MiB model, CPU): read every 1 ms, a
# batch of 1-2 calls, +73 us of the main thread per step; every 16 calls +42 us; page faults 0 per step both ways.
READ_BATCH = 16
READ_EVERY_S = 0.02
READ_KEPT_BYTES = 16 * 2**20
# pmap'd calls' rows are read stacked (see Watch._rows), at a fixed cost per batch (~260 us on 4 CPU devices, the
# same for 2 calls as for 16): their finished calls wait for a batch up to this long.
READ_PMAP_EVERY_S = 0.05
# Off CPU, the unread calls' vectors travel to the host READ_BATCH at a time: stacked on the device by one small
# program dispatched right after the batch's last call (queued behind it, never waited for then) and copied in one
# transfer, started at once. H200 (jax 0.11.2), a tiny jitted function: copy_to_host_async ~30-50 us of host time
# a call and np.asarray of its copy ~6 us, so a copy per call was most of the watch's +107 us per call. A batch
# left short is stacked once its oldest call is COPY_AFTER_S old, so that a read READ_EVERY_S later finds it copied.
COPY_AFTER_S = READ_EVERY_S / 2
# Whether unread calls' vectors are copied ahead of their read (above): None, off CPU only (on CPU there is nothing
# to copy: the buffer protocol reads them in place); True or False forces it (tests run the device's path on CPU).
COPY_AHEAD: bool | None = None
WHOLE_BATCHES, ALL_FINISHED = 1, 2  # what a due read reads (see Watch._reads_due)
# Unread calls keep their inputs (a copy of the model each, for a training step): beyond this many bytes kept by
# the calls before the latest, the oldest is read (waiting for it). A large model's step is long, so the wait
# costs it little, and the run's peak stays at one model copy above the program's (a 48-block MLP of 392 MiB
# of parameters, 3 unread steps: 1.30x the plain run's peak before nan-hunt's replay even began).
MAX_KEPT_BYTES = 256 * 2**20
EAGER_OPS_PER_CALL = 64  # after an Inf, eager operations are budgeted at this many per jitted call
MAX_INF_FINDINGS = 8  # distinct Inf births kept while waiting for a NaN (each keeps its call's inputs alive)
MADE_EAGERLY = 4096  # eager outputs remembered with their line (for the growth of an eagerly updated argument)
# With ``trim``, once the read calls have let go of this many bytes of kept inputs, glibc's free memory is given
# back (malloc_trim). A kept input outlives the program's own use of it, so it is freed late, between buffers
# allocated since, and its pages stay resident as holes in the heap: the watched run's peak, not its arrays.
# 48-block MLP (392 MiB of parameters, a trim every step): nan-hunt's peak 28-366 MiB lower in 12 of 12 runs
# (1536-1759 MiB against 1657-2040), CPU of a 30-step loop unchanged within noise (median 32.3 s both ways).
TRIM_AFTER_BYTES = 64 * 2**20
# With ``hold_freed``, on CPU, while watching, glibc keeps up to this much free memory at a heap's top instead of
# giving it back at once (its default: 128 KiB and up). The kept inputs of a read call are freed after the next
# call's outputs were allocated, so the freed space ends up at the top, was given back, and was faulted in
# again by the next step. Flax NNX MLP loop (0.7 ms steps, 1500 watched steps): 74-84k minor page faults in the
# whole process, 59-60k with it, 54-62k with no inputs kept at all; the watch's CPU over plain 1.09-1.13x ->
# 1.08-1.10x.
HOLD_FREED_BYTES = 64 * 2**20



@dataclass
class JitFinding:
    """A jitted call with non-finite outputs (``kind``: 'nan' if any output holds a NaN, else 'inf').

    ``feeds``: for a NaN found after Infs, the Infs its arguments held, as (index in the watch's
    ``inf_findings``, flat output position of that finding's call, or None for an eager finding);
    ``argument_feeds``: the same per argument leaf (by its name in the replay), for the arguments that held one.
    """

    call: Call
    nonfinite_outputs: list[str]
    kind: OriginKind = "nan"
    closed_jaxpr: Any = None  # traced while the call was under way (None: trace it again later)
    feeds: frozenset[tuple[int, int | None]] = field(default_factory=frozenset)
    argument_feeds: dict[str, frozenset[tuple[int, int | None]]] = field(default_factory=dict)


@dataclass
class EagerFinding:
    """An operation run eagerly that created a non-finite value (already fully localised)."""

    origin: Origin
    feeds: frozenset[tuple[int, int | None]] = field(default_factory=frozenset)

    @property
    def kind(self) -> OriginKind:
        return self.origin.kind


@dataclass(frozen=True)
class Transformed:
    """A watched jitted function's call through a transformation applied outside jit (``jax.grad(loss)(w)``):
    the function's name, the transformation ('jax.grad'), the call's 0-based index among that function's calls
    through it, and how many output leaves the function returns (None: not counted)."""

    function: str
    transform: str
    index: int
    output_leaves: int | None = None
    outer: str | None = None  # the function the transformation was given, where it calls this one (``loss``)

    @property
    def path(self) -> tuple[str, ...]:
        """The head of the origin's path: ``('jax.grad(loss)',)``, or ``('jax.grad(loss)', 'jit(layer)')``
        where ``loss`` calls the jitted ``layer``.

        Example:
            >>> Transformed("layer", "jax.grad", 6, 1, outer="loss").path
            ('jax.grad(loss)', 'jit(layer)')
        """
        if self.outer is None:
            return (f"{self.transform}({self.function})",)
        return (f"{self.transform}({self.outer})", f"jit({self.function})")

    def residuals(self, outputs: int) -> frozenset[int]:
        """Of the ``outputs`` of the forward program jax.grad runs eagerly (the function's outputs, then the
        residuals for the backward pass), the residuals' positions.

        Example:
            >>> Transformed("loss", "jax.grad", 0, 1).residuals(3)
            frozenset({1, 2})
        """
        if self.transform != "jax.grad" or self.output_leaves is None:
            return frozenset()
        return frozenset(range(self.output_leaves, outputs))


class NonFiniteFound(BaseException):
    """Ends the watched program at the first non-finite call (caught by jaxdbg, not by the program)."""

    def __init__(self, finding: JitFinding | EagerFinding):
        super().__init__(_describe(finding))
        self.finding = finding


def _describe(finding: JitFinding | EagerFinding) -> str:
    if isinstance(finding, EagerFinding):
        return f"eager {finding.origin.primitive} made a {finding.origin.kind}"
    return (f"call {finding.call.call_index} of {finding.call.name} returned non-finite "
            f"{', '.join(finding.nonfinite_outputs[:3])}")


def _with_inf(outs: list, checked: list[tuple[bool, bool, float]]) -> list:
    """The outputs of an eager operation that hold an Inf (``checked``: each one's flags): a finite output of the
    same operation (the primal value beside a derivative's residual) does not carry the Inf on."""
    return [out for out, (_, inf, _) in zip(outs, checked) if inf]


def _keeps_fast_path(executable_name: str) -> bool:
    """The user's watched functions and jaxdbg's own keep jax's C++ dispatch (eager jax functions do not)."""
    return jit_layer.in_user_call() or executable_name.endswith(("_jaxdbg", "_jaxdbg)"))


def _trace_now(call: Call, x64: bool | None = None) -> Any:
    """The call's jaxpr, traced while the call is still under way. Framework wrappers (``nnx.jit``) jit an
    inner function that only runs inside the context their own ``__call__`` sets up; traced later, outside
    it, that function raises. ``x64``: whether the call ran with ``jax_enable_x64`` (a call read late may be
    traced after the program's ``jax.enable_x64`` block ended: traced without it, its float64 became float32).
    None if tracing fails here too (the analysis then says why)."""
    from jaxdbg.nan.localise import trace_for_replay  # the watch itself needs no interpreter

    try:
        with jit_layer.internal():
            if x64 is not None and x64 != _compat.x64_enabled():
                with jax.enable_x64(x64):
                    return trace_for_replay(call)
            return trace_for_replay(call)
    except Exception:  # noqa: BLE001 - the later analysis traces again and reports the failure
        return None


@functools.lru_cache(maxsize=256)
def _assigned_names(file: str, line: int) -> tuple[str, ...] | None:
    """``('params', 'loss')`` for a call written ``params, loss = step(...)`` on that line, else None."""
    text = linecache.getline(file, line).strip()
    try:
        statement = ast.parse(text).body[0]
    except (SyntaxError, IndexError, ValueError):
        return None
    if not isinstance(statement, (ast.Assign, ast.AnnAssign)):
        return None
    target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
        return tuple(e.id for e in target.elts if isinstance(e, ast.Name))
    return None


class _Watched:
    """What the watch keeps of one jitted function: its output leaf names, the line that calls it, and the
    arrays its latest call returned (weak references by id: an argument that is one of them was measured
    as an output already)."""

    def __init__(self) -> None:
        self.leaf_names: list[str] | None = None
        self.call_site: SourceLocation | None = None
        self.returned: dict[int, weakref.ref] = {}


def _signature(call: Call) -> tuple:
    statics = sorted(call._static_sets()[0])
    return (tuple((np.shape(x), str(getattr(x, "dtype", type(x))), getattr(x, "weak_type", False))
                  for x in call.leaves()), tuple(id(call.args[i]) for i in statics))


def _replay_of(call: JitCall, site: SourceLocation | None, output_names: list[str] | None = None,
               series: str = "") -> Call:
    """A watched call as nan-hunt replays it, from the inputs it kept: a jitted function's Python function, or a
    pmap'd function as jax built it (traced, pmap's jit of a shard_map of the user's function over the devices,
    so that the replay runs each device's block and names the device that made the first NaN)."""
    function = call.function
    args, kwargs = call.notes["nan_inputs"].unpack()
    fun = function.jitted if function.is_pmap else function.fun
    return Call(function.name, fun, tuple(args), dict(kwargs), function.static_argnums, function.static_argnames,
                call.index, site, output_names, pmap=function.is_pmap, series=series)


def _same_signature(a: Call, b: Call) -> bool:
    """Whether one jaxpr serves both calls: the same function, argument types and static arguments."""
    try:
        return a.fun is b.fun and _signature(a) == _signature(b)
    except Exception:  # noqa: BLE001 - then trace anew
        return False


def _flat(rows: np.ndarray) -> tuple[array, int]:
    """Rows of magnitudes as :meth:`Watch._rows` gives them: float32 end to end, and the rows' width."""
    return array("f", rows.astype(np.float32, copy=False).tobytes()), rows.shape[1]


class _CopiedRows:
    """Several calls' magnitude vectors (of one shape, on one device) stacked on the device and copied to the host
    in one transfer, started when made (padded to :data:`READ_BATCH` rows: one program serves every batch)."""

    __slots__ = ("_host", "_stacked")

    def __init__(self, vectors: list) -> None:
        self._stacked = stacked_jaxdbg(vectors + [vectors[0]] * (READ_BATCH - len(vectors)))
        self._stacked.copy_to_host_async()
        self._host: np.ndarray | None = None

    def row(self, index: int) -> np.ndarray:
        if self._host is None:
            self._host = np.asarray(self._stacked)
        return self._host[index]


def _finished(magnitudes: Any) -> bool:
    """Whether the computation that makes ``magnitudes`` is done (reading it then does not wait)."""
    try:
        return bool(magnitudes.is_ready())
    except AttributeError:  # not a jax array: nothing to wait for
        return True


class Structures:
    """The distinct input structures (pytree definitions) one function's checked companion has been called
    with, so that a call's kept inputs share an equal structure instead of keeping their own.

    Comparing two structures runs a framework's own ``==`` (Flax NNX's GraphDef: ~80 us a step, as much again as
    jax's dispatch spends on the same compare). The companion's caches are its own (it is a function made for
    this instrumented function), so a call during which jax traced nothing was called with a structure an
    earlier, watched call of it had: while only one structure has ever been seen, that is the one, and no compare
    is needed. A call that raised after jax traced for it leaves a structure unseen: from then on every call
    compares.

    Example:
        >>> seen = Structures()
        >>> first = jax.tree_util.tree_structure(({"w": 1.0},))
        >>> seen.share(first, traced=True) is first, seen.share(jax.tree_util.tree_structure(({"w": 2.0},)),
        ...                                                     traced=False) is first
        (True, True)
    """

    KEEP = 8  # distinct structures remembered (a function called with more compares with the latest)

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.only_one = True  # every structure the companion was traced for is in seen, and there is one
        self.nbytes: int | None = None  # the latest traced call's input bytes (calls with no trace: the same)

    def input_bytes(self, leaves: Sequence[Any], traced: bool) -> int:
        """The bytes of a call's array inputs (remembered from the latest call jax traced for)."""
        if traced or self.nbytes is None:
            self.nbytes = sum(leaf.nbytes for leaf in leaves if isinstance(getattr(leaf, "nbytes", None), int))
        return self.nbytes

    def share(self, treedef: Any, traced: bool) -> Any:
        """``treedef``, or an equal one seen before (``traced``: jax traced during this call)."""
        seen = self.seen
        if not traced and self.only_one and seen:
            return seen[0]
        for known in reversed(seen):
            try:
                if known == treedef:  # a framework's aux data compares its own way; any failure: keep ours
                    return known
            except Exception:  # noqa: BLE001
                break
        seen.append(treedef)
        if len(seen) > 1:
            self.only_one = False
            del seen[:-self.KEEP]
        return treedef

    def unsure(self) -> None:
        """A call raised after jax traced for it: its structure was never seen here."""
        self.only_one = False


_ARRAY_TYPE = _compat.array_class()  # jax's concrete array class: tested by identity on every call (no ABC check)


class KeptInputs:
    """A call's inputs kept for its replay: their leaves, and their tree structure, shared with the function's
    earlier calls when jax's own cache would call it the same (:class:`Structures`).

    A framework builds its call's structure anew each step (Flax NNX: a GraphDef of ~300 Python objects); kept
    with every unread call, those objects set off Python's cyclic GC every two steps or so (measured ~70 gen-0
    and 6 gen-1 collections per 200 steps of a CNN loop, and a 70-100 ms full collection now and then); plain,
    none. Shared, the new structure is freed at once, as it is without the watch. Arguments that are all arrays
    are kept as they are (nothing to share, nothing to flatten).

    Example:
        >>> seen = Structures()
        >>> kept = KeptInputs.of(({"w": 1.0}, [2.0]), {"scale": 3.0}, seen)
        >>> kept.unpack()
        (({'w': 1.0}, [2.0]), {'scale': 3.0})
        >>> again = KeptInputs.of(({"w": 4.0}, [5.0]), {"scale": 6.0}, seen)
        >>> again.treedef is kept.treedef, again.leaves
        (True, [4.0, 5.0, 6.0])
    """

    __slots__ = ("leaves", "nbytes", "treedef")

    def __init__(self, leaves: list, treedef: Any, nbytes: int = 0):
        self.leaves = leaves
        self.treedef = treedef
        self.nbytes = nbytes  # of the arrays kept (see MAX_KEPT_BYTES)

    @classmethod
    def of(cls, args: tuple, kwargs: dict, structures: Structures | None, traced: bool = True,
           flat: tuple[list, Any] | None = None) -> KeptInputs:
        """``args``/``kwargs`` kept; ``structures``: the function's (None: none shared); ``traced``: jax traced
        during this call (or whether it did is unknown); ``flat``: ``tree_flatten((args, kwargs))`` if already
        made."""
        if not kwargs:
            for arg in args:
                if type(arg) is not _ARRAY_TYPE:
                    break
            else:  # only arrays: nothing to share, nothing to flatten
                return cls([(args, kwargs)], None, structures.input_bytes(args, traced) if structures else 0)
        try:
            leaves, treedef = flat if flat is not None else tree_flatten((tuple(args), dict(kwargs)))
        except Exception:  # noqa: BLE001 - a pytree that will not flatten: jax's own call reports it; kept whole
            return cls([(args, kwargs)], None)
        if structures is None:
            return cls(leaves, treedef)
        return cls(leaves, structures.share(treedef, traced), structures.input_bytes(leaves, traced))

    def unpack(self) -> tuple[tuple, dict]:
        args, kwargs = self.leaves[0] if self.treedef is None else jax.tree_util.tree_unflatten(
            self.treedef, self.leaves)
        return args, kwargs


def _kept_bytes(call: JitCall) -> int:
    kept = call.notes.get("nan_inputs")
    return kept.nbytes if kept is not None else 0


def _same(ref: Any, value: Any) -> bool:
    return ref is not None and ref() is value


def _weak(value: Any) -> weakref.ref | None:
    try:
        return weakref.ref(value)
    except TypeError:  # Python scalars
        return None


class Watch(JitHook):
    """Context manager that watches ``jax.jit`` calls and eager operations for the first NaN/Inf.

    Args:
        nan_only: only a NaN counts (Inf is ignored).
        growth_factor: a leaf whose magnitude grows by this factor is reported as growth.
        eager: also check operations run eagerly (outside jit).
        after_inf: after the first Inf, keep watching for a NaN for up to this many jitted calls (and
            :data:`EAGER_OPS_PER_CALL` times as many eager operations); 0 ends the run at the first Inf.
        read_late: read a call's flags once its computation has finished, at a later call (or when an eager
            operation makes a NaN/Inf, or the watch ends), instead of waiting for it: no host-device sync per
            step. The inputs (and outputs) of the unread calls are kept. After the first Inf, calls are read
            at once again (the Infs are followed in program order).
        trim: give glibc's free memory back to the system once the read calls have let go of
            :data:`TRIM_AFTER_BYTES` of kept inputs (nan-hunt's child).
        hold_freed: on CPU, let glibc keep up to :data:`HOLD_FREED_BYTES` of free memory while watching, instead
            of giving it back and faulting it in again each step (:func:`jaxdbg.watch`); set back to glibc's
            default when the watch ends.
    """

    check_outputs = True  # the jit layer's max(|x|) of every floating output, in the function's own program

    def __init__(self, nan_only: bool = False, growth_factor: float = 100.0, eager: bool = True,
                 after_inf: int = 0, read_late: bool = False, trim: bool = False, hold_freed: bool = False):
        self.nan_only = nan_only
        self.read_late = read_late
        self._pending: collections.deque[JitCall] = collections.deque()  # read_late: flags not read yet
        self._copies = 0  # pending calls that donate: their inputs are device copies kept for the replay
        self._stacking = True  # pmap'd calls' magnitude rows are stacked on the device to be read (see _rows)
        self._kept_bytes = 0  # of the inputs the pending calls keep
        self._trim = trim
        self._released = 0  # bytes of kept inputs let go since the last trim
        self._hold_freed = hold_freed
        self._holding = False  # glibc's trim threshold is raised (see HOLD_FREED_BYTES)
        self._read_at = 0.0  # when finished calls were last read short of a batch (time.perf_counter())
        self._unread: int | None = None  # calls left unread at most (decided at the first call)
        self._copy_ahead = False
        self._to_copy: list[JitCall] = []  # with _copy_ahead: unread calls whose vectors are not copied yet
        self._to_copy_since = 0.0  # when the oldest of them was deferred (time.perf_counter())
        self._unstacked: set = set()  # vector shapes whose vectors did not stack (see _copy_together)
        self._series_keys: dict[int, str] = {}  # function (record id) -> the growth series of its outputs
        self.growth = GrowthTracker(growth_factor)
        self._eager_updates = EagerUpdates(self.growth)  # values a loop run without jit updates eagerly
        self.eager = eager
        self.after_inf = after_inf
        self.active = False
        self.calls = 0
        self.eager_ops = 0
        self.functions: list[InstrumentedJit] = []
        self._watched: dict[int, _Watched] = {}
        self.finding: JitFinding | EagerFinding | None = None
        self.inf_findings: list[JitFinding | EagerFinding] = []  # Infs seen while waiting for a NaN
        self._left = (0, 0)  # (jitted calls, eager operations) still watched after the first Inf
        # id(array) -> the Infs it holds, each as (index in inf_findings, flat output position or None)
        self._infs: dict[int, tuple[weakref.ref, frozenset[tuple[int, int | None]]]] = {}
        self._births: dict[tuple, tuple[int, int | None]] = {}  # (function, float leaf) or (eager line, op) -> Inf
        self._read: set[int] = set()  # Infs (indices) that a later call or eager operation was given
        # ... of those, the ones an eager backward-pass operation (of jax.grad run outside jit) was given, and the
        # ones anything else was given: an eager Inf read only by the former is a derivative's residual
        self._read_backward: set[int] = set()
        self._read_forward: set[int] = set()
        self._made_eagerly: collections.OrderedDict[int, tuple[weakref.ref, SourceLocation]] = (
            collections.OrderedDict())
        self._argument_names: dict[tuple[int, int], list[str]] = {}
        self._structures: dict[InstrumentedJit, Structures] = {}  # the input structures of each function's calls
        # id(argument) -> its max(|x|): the same batch or constant passed again is not reduced again
        self._fresh_measured: dict[int, tuple[weakref.ref, float]] = {}
        self._fresh_before: dict[int, tuple] = {}  # function -> its latest call's fresh positions and magnitudes
        self._stack: contextlib.ExitStack | None = None
        # Calls of the user functions that run eager operations: code -> (frame of its latest call, 0-based
        # index of that call). Holding the frame keeps the next call from reusing its identity.
        self._eager_calls: dict[Any, tuple[Any, int]] = {}
        # Calls of pmap'd functions, by the user line making them: (code, line) -> how many ran. A pmap reaches
        # the eager hook as one jitted operation; its call index is its count at that line (the training step).
        self._pmap_calls: collections.Counter = collections.Counter()
        self._user_files: dict[str, bool] = {}

    # -- installation ---------------------------------------------------------------------------------------

    def __enter__(self) -> Watch:
        stack = contextlib.ExitStack()
        # Calls cached before now would keep jax's C++ dispatch and stay invisible to the eager hook; the
        # entries made while watching are dropped again on exit so later code gets the fast path back.
        jax.clear_caches()
        stack.callback(jax.clear_caches)
        stack.enter_context(jit_layer.installed(self))
        if self.eager:
            stack.enter_context(_compat.eager_hooks(self._on_eager, self._on_eager_jit, _keeps_fast_path))
        stack.callback(setattr, self, "active", False)
        self._stack = stack
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.active:
                self.flush()  # the unread calls came before whatever ends the block: may raise NonFiniteFound
        finally:
            self._close()

    def _close(self) -> None:
        stack, self._stack = self._stack, None
        self._pending.clear()
        self._to_copy.clear()
        self._kept_bytes = 0
        self._eager_calls.clear()
        self._pmap_calls.clear()
        self._infs.clear()
        self._made_eagerly.clear()
        self.stop_holding_freed()
        if self.finding is None and self.inf_findings:
            self._residual_passes()
            self.finding = self.inf_findings[0]  # the program ended (or failed) after an Inf, with no NaN
        if stack is not None:
            stack.close()

    def stop_holding_freed(self) -> None:
        """Let glibc give free memory back again, if ``hold_freed`` held it (when the watch ends; the last of nested
        watches sets glibc's default back)."""
        if self._holding:
            self._holding = False
            _malloc.release_freed()

    # -- hooks of the jit layer ------------------------------------------------------------------------------

    def on_jit(self, function: InstrumentedJit) -> None:
        self.functions.append(function)

    def before(self, call: JitCall) -> None:
        if not self.active:
            return
        if self._pending:
            self.read_finished()
            if not self.active:
                return
        function, notes = call.function, call.notes
        flat = None
        if function.donates and jit_layer.donates_arrays(call):  # kept to replay the call: copies, before it deletes
            notes["nan_copies"] = jit_layer.device_copies((call.args, call.kwargs))
            notes["copied"] = True
        elif not function.static_argnums and not function.static_argnames:  # flattened once, for both uses
            with contextlib.suppress(Exception):  # arguments jit itself would reject: measured and kept whole
                flat = notes["nan_flat"] = tree_flatten((tuple(call.args), dict(call.kwargs)))
        notes["nan_fresh"] = self._measure_fresh_arguments(call, flat[0] if flat is not None else None)

    def keep_inputs(self, call: JitCall) -> None:
        """Keep a call's inputs for its replay (once it ran: whether jax traced for it tells whether its input
        structure needs comparing, see :class:`Structures`)."""
        notes = call.notes
        copies = flat = None
        if notes:  # jaxdbg.watch's calls have none here: asked on every call, so read only if there
            # read, not taken: a watch nested in another keeps the same call's inputs too (the notes are shared)
            copies, flat = notes.get("nan_copies"), notes.get("nan_flat")
        args, kwargs = copies if copies is not None else (call.args, call.kwargs)
        function = call.function
        structures = self._structures.get(function)
        if structures is None:
            structures = self._structures[function] = Structures()
        notes["nan_inputs"] = KeptInputs.of(args, kwargs, structures, bool(call.spans) or not call.check, flat)
        notes["nan_x64"] = _compat.x64_enabled()  # ~0.1 us: the call's replay is traced as the call ran

    def on_exception(self, call: JitCall, err: BaseException) -> None:
        structures = self._structures.get(call.function)
        if structures is not None and call.spans:
            structures.unsure()

    def after(self, call: JitCall, out: Any) -> None:
        if not self.active or "nan_fresh" not in call.notes:
            return
        self.keep_inputs(call)
        site = caller_user_frame(2)
        seen = self.seen(call.function, out, site)
        outs = tree_leaves(out)
        seen.returned = {id(leaf): ref for leaf in outs if (ref := _weak(leaf)) is not None}
        if not self.read_late or self.inf_findings:  # after an Inf: at once, in order with eager operations
            self.flush()
            self.read(call, out, site)
            return
        call.notes["out"] = outs  # followed if an Inf turns up among the unread calls (by leaf)
        self.defer(call, site)

    # -- reading late -----------------------------------------------------------------------------------------

    def defer(self, call: JitCall, site: SourceLocation | None) -> None:
        """Leave ``call``'s flags unread until its computation has finished (``site``: its line, for a finding
        read later); they are read before a later call runs (:meth:`read_finished`), or now when the unread calls
        pass a bound (:meth:`read_due`)."""
        if self._unread is None:  # the first call: the backend is up by now
            # In a job, every process must read (and analyse: the analysis gathers sharded inputs) at the same
            # call whatever its timing: there the flags of call k are read at call k+1, waiting if need be.
            self._unread = 1 if jax.process_count() > 1 else MAX_PENDING
            # Off CPU, the calls' small device->host copies start before they are read, READ_BATCH calls' vectors
            # in one (see _start_copy): read later, they are on the host already. A read never queues work on the
            # device (it would wait behind the steps still running: see _rows, _fill_hosts). On CPU there is
            # nothing to copy (starting one cost ~35 us a call).
            self._copy_ahead = jax.default_backend() != "cpu" if COPY_AHEAD is None else COPY_AHEAD
            if self._hold_freed and not self._copy_ahead:  # the kept inputs are host memory
                self._holding = _malloc.hold_freed(HOLD_FREED_BYTES)
        if self._copy_ahead:
            self._start_copy(call)
        notes = call.notes
        notes["site"] = site
        kept = notes.get("nan_inputs")
        if kept is not None:
            self._kept_bytes += kept.nbytes
        pending = self._pending
        pending.append(call)
        if call.notes.get("copied"):
            self._copies += 1
        if len(pending) > self._unread or self._copies > MAX_PENDING_COPIES or self._kept_bytes > MAX_KEPT_BYTES:
            self.read_due()

    def _start_copy(self, call: JitCall) -> None:
        """Off CPU: see that ``call``'s vector is on its way to the host before it is read, with the vectors of the
        calls deferred around it (:class:`_CopiedRows`, :data:`COPY_AFTER_S`); a pmap'd call's alone (its rows are
        stacked when read, see :meth:`_rows`), and every call's alone in a job (each is read at the next call)."""
        if call.function.is_pmap or self._unread == 1:
            with contextlib.suppress(AttributeError):
                call.magnitudes.copy_to_host_async()
            return
        to_copy = self._to_copy
        now = time.perf_counter()
        if not to_copy:
            self._to_copy_since = now
        to_copy.append(call)
        if len(to_copy) >= READ_BATCH or now - self._to_copy_since >= COPY_AFTER_S:
            self._copy_together()

    def _copy_together(self) -> None:
        """Stack the vectors of the calls not copied yet, those of one length together, and start their copy
        (:class:`_CopiedRows`); a vector alone of its length, or of a length whose vectors did not stack (on
        different devices), starts a copy of its own."""
        calls, self._to_copy = self._to_copy, []
        by_length: dict[Any, list[JitCall]] = {}
        for call in calls:
            by_length.setdefault(getattr(call.magnitudes, "shape", None), []).append(call)
        for length, group in by_length.items():
            if len(group) > 1 and length is not None and length not in self._unstacked:
                try:
                    with self.internal():
                        rows = _CopiedRows([call.magnitudes for call in group])
                except Exception:  # noqa: BLE001 - vectors that do not stack: one copy each from now on
                    self._unstacked.add(length)
                else:
                    for index, call in enumerate(group):
                        call.notes["rows"] = (rows, index)
                    continue
            for call in group:
                with contextlib.suppress(AttributeError):
                    call.magnitudes.copy_to_host_async()

    def _fill_hosts(self, calls: list[JitCall]) -> None:
        """Before ``calls`` (the oldest unread) are read: each one's magnitudes on the host from the rows copied
        with it. Those still waiting for their batch are copied together now if the device has finished every
        watched call (then the stacking program waits for nothing), else each is copied alone as it is read (a
        finished vector's copy does not wait behind the calls still running; a program would)."""
        to_copy = self._to_copy
        if len(to_copy) > 1 and any(call is calls[-1] for call in to_copy) and _finished(to_copy[-1].magnitudes):
            self._copy_together()
        for call in calls:
            copied = call.notes.get("rows")
            if copied is not None:
                call.use_host_magnitudes(copied[0].row(copied[1]))

    def series_key(self, function: InstrumentedJit) -> str:
        """The growth series of ``function``'s outputs: its name, or ``name@id`` for a function named as one watched
        before it (``jax.jit(loss)`` beside ``jax.jit(jax.value_and_grad(loss))``: both 'loss'). One series for
        both restarted at every call whose width differed: nothing could grow, and every call was read alone."""
        ident = function.record.id
        key = self._series_keys.get(ident)
        if key is None:
            taken = function.name in self._series_keys.values()
            key = self._series_keys[ident] = f"{function.name}@{ident}" if taken else function.name
        return key

    def read_due(self) -> None:
        """Read the oldest unread calls, waiting for them, while the unread calls pass a bound: more than
        :data:`MAX_PENDING` calls (in a multi-process job, more than one: call k is read at call k+1), more than
        :data:`MAX_PENDING_COPIES` that donate, or more than :data:`MAX_KEPT_BYTES` of inputs kept by the calls
        before the latest."""
        pending = self._pending
        while len(pending) > (self._unread or MAX_PENDING) or self._copies > MAX_PENDING_COPIES:
            self._read_oldest()
        while len(pending) > 1 and self._kept_bytes - _kept_bytes(pending[-1]) > MAX_KEPT_BYTES:
            self._read_oldest()
        self._trim_released()

    def read_finished(self) -> None:
        """Before a watched call runs: read the flags of the unread calls that have finished, oldest first,
        :data:`READ_BATCH` at a time once that many have finished, and whatever has finished once
        :data:`READ_EVERY_S` has passed since the last read (a quarter of it while the unread calls keep
        :data:`READ_KEPT_BYTES` of inputs); never waits (waiting for a running call is a host-device sync per step,
        ~15% on a CPU training loop).

        Counted in finished calls, not unread ones: a program that runs ahead of its device has many unread calls
        of which only the oldest has finished at each call. Reading whenever 16 were unread read that one alone at
        every call, at the cost of a whole read (Flax NNX MLP loop on CPU, 20-30 calls ahead: 840 reads of one call
        in 1000 steps, ~100 us each).

        Before the call, not after it: a clean call's kept inputs (a training step's, the model before it) are let
        go before the next call allocates its outputs, so its memory is reused at once as in the plain run. Read
        after the next call, one more copy of the model was alive at each allocation: on a Flax NNX MLP loop
        (1.2 ms steps, CPU), ~25 more page faults per step (about 1% of the step)."""
        due = self._reads_due()
        if due:
            self._read_finished(due)

    def _reads_due(self) -> int:
        """Whether :meth:`read_finished` reads now (asked before every call; most often, it does not): 0, not now;
        :data:`WHOLE_BATCHES`, batches of :data:`READ_BATCH` finished calls; :data:`ALL_FINISHED`, every finished
        call."""
        pending = self._pending
        if self._unread == 1 or not pending:
            return 0
        every = READ_PMAP_EVERY_S if pending[0].function.is_pmap else READ_EVERY_S
        if self._kept_bytes >= READ_KEPT_BYTES:
            every /= 4
        if time.perf_counter() - self._read_at >= every:
            return ALL_FINISHED
        if len(pending) >= READ_BATCH and _finished(pending[READ_BATCH - 1].magnitudes):
            return WHOLE_BATCHES
        return 0

    def _read_finished(self, due: int = ALL_FINISHED) -> None:
        self._read_at = time.perf_counter()
        pending = self._pending
        while pending:
            count = min(READ_BATCH, len(pending))
            if not _finished(pending[count - 1].magnitudes):
                if due == ALL_FINISHED:
                    count = sum(1 for _ in itertools.takewhile(lambda c: _finished(c.magnitudes), pending))
                    if count:
                        self._read_batch(count)
                break
            if count < READ_BATCH and due != ALL_FINISHED:
                break
            self._read_batch(count)
        self._trim_released()

    def flush(self) -> None:
        """Read the flags of every unread call, oldest first (waits for them)."""
        while self._pending:
            self._read_batch(min(READ_BATCH, len(self._pending)))
        self._trim_released()

    def _trim_released(self) -> None:
        """With ``trim``, after reading (the calls read are gone by now): give glibc's free memory back once
        :data:`TRIM_AFTER_BYTES` of kept inputs were let go."""
        if self._trim and self._released >= TRIM_AFTER_BYTES:
            self._released = 0
            _malloc.trim()

    def _read_batch(self, count: int) -> None:
        """Read the ``count`` oldest unread calls: when their flags are all finite and no magnitude reaches a
        growth event (the steady state), with one vectorised check and update; else one by one."""
        pending = self._pending
        calls = [pending[i] for i in range(count)]
        if self._copy_ahead:
            self._fill_hosts(calls)
        if self._absorbed(calls):
            self._drop(count)
            self.calls += count
            return
        for _ in range(count):
            self._read_oldest()

    def _absorbed(self, calls: list[JitCall]) -> bool:
        """Record these calls' magnitudes at once, when that is all that reading them one by one would do (their
        flags are finite, no magnitude reaches a growth event, nothing else waits on them); whether it did
        (recording a function's calls twice changes nothing: then they are read one by one)."""
        if self.inf_findings or not self.active:
            return False
        groups: dict[int, tuple[str, list[JitCall]]] = {}  # by function (its name keys its growth series)
        for call in calls:
            function = call.function
            group = groups.get(function.record.id)
            if group is None:
                seen = self._watched.get(function.record.id)
                if seen is None or seen.leaf_names is None:
                    return False
                group = groups[function.record.id] = (self.series_key(function), [])
            if call.notes.get("nan_fresh") is not None:
                return False
            group[1].append(call)
        for key, members in groups.values():
            rows = self._rows(members)
            if rows is None or not self.growth.absorb(key, *rows):
                return False
        return True

    def _rows(self, calls: list[JitCall]) -> tuple[array, int] | None:
        """The calls' magnitudes as float32 rows end to end in one host array, and the rows' width, from each
        call's host copy (started when the call was deferred, off CPU). A jitted call's are not stacked on the
        device first: that program queues behind the steps still running, so the read waited for them, a
        host-device sync every :data:`READ_BATCH` calls (measured on a Flax NNX MLP loop of 1.2 ms steps on CPU:
        1.1 ms per batch, 6-9% of the loop; read from the host, 1-2 us a call). A pmap'd call's rows are, though:
        their host copy assembles a block per device (~28 us a call on 4 CPU devices, against ~16 us stacked;
        padded to :data:`READ_BATCH` rows with the first call's, so one program serves every batch)."""
        if len(calls) > 1 and self._stacking and calls[0].function.is_pmap:
            vectors = [call.magnitudes for call in calls]
            vectors += [vectors[0]] * (READ_BATCH - len(vectors))
            try:
                with self.internal():
                    return _flat(over_devices(np.asarray(stacked_jaxdbg(vectors))[:len(calls)]))
            except Exception:  # noqa: BLE001 - e.g. rows on different devices: one copy each from now on
                self._stacking = False
        if not self._copy_ahead:  # on CPU: every call's vector through the buffer protocol, joined in one copy
            with contextlib.suppress(AttributeError, BufferError, TypeError, ValueError):  # else one copy each
                vectors = [call.magnitudes for call in calls]
                shape = vectors[0].aval.shape
                if len(shape) == 1 and all(vector.aval.shape == shape for vector in vectors):
                    return array("f", b"".join(vectors)), shape[0]
        try:
            return _flat(np.stack([call.host_magnitudes() for call in calls]))
        except ValueError:  # vectors of different lengths (the outputs changed): read one by one
            return None

    def _read_oldest(self) -> None:
        self._check(self._pop())

    def _pop(self) -> JitCall:
        """The oldest unread call, taken off the queue (and off what the queue keeps)."""
        call = self._pending[0]
        if self._copy_ahead:
            self._fill_hosts([call])
        self._drop(1)
        return call

    def _drop(self, count: int) -> None:
        """Take the ``count`` oldest unread calls off the queue (and off what the queue keeps)."""
        pending = self._pending
        copies = released = 0
        to_copy = self._to_copy
        for _ in range(count):
            call = pending.popleft()
            if to_copy and to_copy[0] is call:  # read before its batch was copied: copied alone
                del to_copy[0]
            notes = call.notes
            if notes.get("copied"):
                copies += 1
            kept = notes.get("nan_inputs")
            if kept is not None:
                released += kept.nbytes
        self._copies -= copies
        self._kept_bytes -= released
        self._released += released

    def _check(self, call: JitCall) -> None:
        """Read one unread call's flags."""
        if self.active:
            self.read(call, call.notes.get("out"), call.notes.get("site"))

    def read(self, call: JitCall, out: Any, site: SourceLocation | None) -> None:
        """Read one call's flags (``site``: the user's line that made the call): growth, and a finding if
        they hold a NaN/Inf. ``out`` (the call's outputs) may be None for a call read after it returned: its
        output names must then be known already (:meth:`seen` at its call), and its outputs are not followed."""
        function = call.function
        host = call.host_magnitudes()
        self.calls += 1
        seen = self.seen(function, out, site)
        names = seen.leaf_names or []
        self._record_fresh_arguments(call, seen)
        nan = np.isnan(host)
        bad = nan if (self.nan_only or self.inf_findings) else ~np.isfinite(host)
        if bad.any():
            replay = _replay_of(call, site, list(names), self.series_key(function))
            feeds = self._infs_in(tree_leaves((replay.args, replay.kwargs))) if nan.any() else frozenset()
            finding = JitFinding(replay, [n for n, b in zip(names, bad) if b], "nan" if nan.any() else "inf",
                                 _trace_now(replay, call.notes.get("nan_x64")), feeds,
                                 self._argument_infs(replay) if feeds else {})
            if not self.growth.report():  # nothing grew call after call: perhaps one update jumped
                self._record_failing_arguments(replay, function.record.id, call.index, seen.call_site)
            index = self.found(finding)  # an Inf, while after_inf lets the run go on
            if out is not None:
                self._hold_infs(function.record.id, out, host, frozenset(), index)
        elif self.inf_findings:
            self._after_inf_call(call, out, host, site)
        self.growth.update(function.name, names, host, call.index, seen.call_site, key=self.series_key(function))

    # -- arguments made outside the watched calls (growth) ----------------------------------------------------

    def _measure_fresh_arguments(self, call: JitCall, leaves: list | None = None) -> tuple | None:
        """Start ``max(|x|)`` of the floating arguments that no watched call returned (one reduction on
        the device, read after the call); the others were measured as outputs already. ``leaves``: the call's
        flat dynamic arguments, if already made."""
        function = call.function
        replay = Call(function.name, function.fun, call.args, call.kwargs, function.static_argnums,
                      function.static_argnames)
        if leaves is None:
            try:
                leaves = replay.leaves()
            except Exception:  # noqa: BLE001 - arguments jit itself would reject: nothing to measure
                return None
        returns = [seen.returned for seen in self._watched.values()]
        returned: dict[int, weakref.ref] = returns[0] if len(returns) == 1 else {}
        if len(returns) > 1:
            for each in returns:
                returned.update(each)
        fresh, on_device, on_host = [], [], []
        for i, leaf in enumerate(leaves):
            if not is_inexact(leaf) or _same(returned.get(id(leaf)), leaf):
                continue
            if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
                continue  # a reduction over it is a collective every process would have to join: left out
            fresh.append(i)
            known = self._fresh_measured.get(id(leaf))
            if known is not None and _same(known[0], leaf):  # arrays are immutable: measured once is enough
                on_host.append((i, known[1]))
            elif isinstance(leaf, jax.Array):
                on_device.append((i, leaf))
            else:
                host = np.abs(np.asarray(leaf))
                on_host.append((i, float(host.max()) if host.size else 0.0))
        if not fresh:
            return None
        if not on_device:  # the same batch or constants as the previous call: its growth would not change
            again = (tuple(fresh), tuple(on_host))
            if self._fresh_before.get(function.record.id) == again:
                return None
            self._fresh_before[function.record.id] = again
        device = None
        if on_device:
            with self.internal(), contextlib.suppress(Exception):  # mixed devices: that part goes unmeasured
                device = device_magnitudes_jaxdbg([leaf for _, leaf in on_device])
        sources: list[SourceLocation | None] = [None] * len(leaves)  # only a fresh leaf can have been made eagerly
        for i in fresh:
            sources[i] = self._maker(leaves[i])
        key = (function.record.id, len(leaves))
        if key not in self._argument_names:  # named now: the call's arguments are not kept past it
            self._argument_names[key] = replay.leaf_names()
        return key, on_device, device, on_host, sources

    def _record_fresh_arguments(self, call: JitCall, seen: _Watched) -> None:
        measured = call.notes.get("nan_fresh")
        if measured is None:
            return
        key, on_device, device, on_host, sources = measured
        mags = np.full(key[1], np.nan)
        if device is not None:
            measured = np.asarray(device)
            mags[[i for i, _ in on_device]] = measured
            if len(self._fresh_measured) > MADE_EAGERLY:
                self._fresh_measured.clear()
            for (_, leaf), magnitude in zip(on_device, measured.tolist()):
                if (ref := _weak(leaf)) is not None:
                    self._fresh_measured[id(leaf)] = (ref, magnitude)
        for i, value in on_host:
            mags[i] = value
        self.growth.update(call.function.name, self._argument_names[key], mags, call.index, seen.call_site,
                           key=f"{call.function.record.id}:arguments", sources=sources)

    def _record_failing_arguments(self, replay: Call, record_id: int, index: int,
                                  site: SourceLocation | None) -> None:
        """Every argument of the failing call joins its arguments' growth, also those a watched call returned
        (measured only as outputs so far): one bad update that sent a parameter from 0.5 to -739 in the call
        before shows as that parameter's growth into this call (``first_call`` this call), named as the
        argument it is. Only when nothing else grew: a value is reported once."""
        with self.internal(), contextlib.suppress(Exception):  # growth is extra: the finding goes on without it
            leaves = replay.leaves()
            mags = np.full(len(leaves), np.nan)
            # reduced where they live (a model's parameters are not copied to the host); an array another process
            # holds part of is left out, as for the arguments made outside (its reduction would be a collective)
            on_device = [(i, leaf) for i, leaf in enumerate(leaves) if is_inexact(leaf)
                         and isinstance(leaf, jax.Array) and leaf.is_fully_addressable]
            if on_device:
                mags[[i for i, _ in on_device]] = np.asarray(device_magnitudes_jaxdbg([leaf for _, leaf in on_device]))
            for i, leaf in enumerate(leaves):
                if is_inexact(leaf) and not isinstance(leaf, jax.Array):
                    host = np.abs(np.asarray(leaf))
                    mags[i] = float(host.max()) if host.size else 0.0
            names = self._argument_names.get((record_id, len(leaves))) or replay.leaf_names()
            self.growth.update(replay.name, names, mags, index, site, key=f"{record_id}:arguments")

    def _maker(self, value: Any) -> SourceLocation | None:
        entry = self._made_eagerly.get(id(value))
        return entry[1] if entry is not None and _same(entry[0], value) else None

    def _remember_maker(self, outs: Sequence[Any], source: SourceLocation | None) -> None:
        if source is None:
            return
        for out in outs:
            ref = _weak(out)
            if ref is not None:
                self._made_eagerly[id(out)] = (ref, source)
                self._made_eagerly.move_to_end(id(out))
        while len(self._made_eagerly) > MADE_EAGERLY:
            self._made_eagerly.popitem(last=False)

    # -- after an Inf: which arrays hold which Infs, until a NaN ----------------------------------------------

    def _infs_in(self, values: Sequence[Any], backward: bool = False) -> frozenset:
        """The Infs these values hold (and, as they are being read, those Infs count as passed on; ``backward``:
        read by an eager backward-pass operation)."""
        held: frozenset = frozenset()
        for value in values:
            entry = self._infs.get(id(value))
            if entry is not None and _same(entry[0], value):
                held |= entry[1]
        read = {index for index, _ in held}
        self._read |= read
        (self._read_backward if backward else self._read_forward).update(read)
        return held

    def _residual_passes(self) -> None:
        """An Inf made eagerly in the forward (jvp) pass of a ``jax.grad`` run outside jit that only backward-pass
        operations read is a derivative's residual (``0.5 / sqrt(x)``, computed ahead for sqrt's derivative): it
        belongs to the backward pass, as the jitted analysis tells by data flow (:mod:`jaxdbg.nan.passes`)."""
        for index, finding in enumerate(self.inf_findings):
            if not isinstance(finding, EagerFinding):
                continue
            origin = finding.origin
            if (origin.pass_ == "forward" and "jvp(" in origin.name_stack and index in self._read_backward
                    and index not in self._read_forward):
                finding.origin = dataclasses.replace(origin, pass_="backward")

    def _argument_infs(self, call: Call) -> dict[str, frozenset]:
        """Per argument leaf of a call, the Infs it holds (only the leaves that hold one): the replay names the
        arguments a NaN came in through, and only their Infs fed it."""
        try:
            pairs = zip(call.leaf_names(), call.leaves())
        except Exception:  # noqa: BLE001 - the call-wide feeds remain
            return {}
        return {name: held for name, leaf in pairs if (held := self._infs_in([leaf]))}

    def _hold(self, values: Sequence[Any], infs: frozenset) -> None:
        for value in values:
            ref = _weak(value)
            if infs and ref is not None:
                self._infs[id(value)] = (ref, infs)

    def _hold_infs(self, function: int, out: Any, host: np.ndarray, held: frozenset, new: int | None) -> None:
        """Mark the output leaves of a call that hold an Inf: with the Infs its arguments held, else as born in
        ``new`` (else in the finding that last made the same leaf of this function Inf). An Inf is named by
        (finding, flat output position), so that its analysis can follow just the outputs that carried it on."""
        leaves = tree_leaves(out)
        floats = [(position, leaf) for position, leaf in enumerate(leaves) if is_inexact(leaf)]
        for i in np.nonzero(np.isinf(host))[0]:
            if i >= len(floats):
                continue
            position, leaf = floats[i]
            if not held and new is not None:
                self._births[(function, int(i))] = (new, position)
            born = self._births.get((function, int(i)))
            self._hold([leaf], held or (frozenset({born}) if born is not None else frozenset()))

    def seen(self, function: InstrumentedJit, out: Any, site: SourceLocation | None) -> _Watched:
        """What the watch keeps of ``function``; at its first call, its output leaf names (by the assignment
        at ``site``, the call's line: ``params, loss = step(...)``)."""
        seen = self._watched.get(function.record.id)
        if seen is None:
            seen = self._watched[function.record.id] = _Watched()
        if seen.leaf_names is None:
            seen.call_site = site
            seen.leaf_names = self._float_leaf_names(out, function.name, site)
        return seen

    def _after_inf_call(self, call: JitCall, out: Any, host: np.ndarray, site: SourceLocation | None) -> None:
        """A call after the first Inf with no NaN in its outputs: pass on which Infs its outputs hold, or
        record a new Inf birth; end the run when the budget is spent."""
        inf = np.isinf(host)
        if inf.any():
            args, kwargs = call.notes["nan_inputs"].unpack()
            held = self._infs_in(tree_leaves((args, kwargs)))
            new = None if held else self._jit_birth(call, [int(i) for i in np.nonzero(inf)[0]], site)
            self._hold_infs(call.function.record.id, out, host, held, new)
        self._spend(calls=1)

    def _jit_birth(self, call: JitCall, leaves: list[int], site: SourceLocation | None) -> int | None:
        """Record a call that made an Inf from finite arguments; returns its index in :attr:`inf_findings`.

        An overflow often recurs every step (a loss that stays inf). The slot of an earlier birth of the same
        leaves whose Infs nothing has read since is reused (the first Inf's slot is kept for the report), and
        its jaxpr too when the signature is the same: no new trace, which would clear jax's caches."""
        function = call.function
        replay = _replay_of(call, site, series=self.series_key(function))
        before = {self._births[key][0] for key in ((function.record.id, i) for i in leaves) if key in self._births}
        same = next((f.closed_jaxpr for f in self.inf_findings if isinstance(f, JitFinding)
                     and f.closed_jaxpr is not None and _same_signature(f.call, replay)), None)
        finding = JitFinding(replay, [], "inf",
                             same if same is not None else _trace_now(replay, call.notes.get("nan_x64")))
        if len(before) == 1 and (slot := before.pop()) != 0 and slot not in self._read:
            self.inf_findings[slot] = finding
            return slot
        if len(self.inf_findings) >= MAX_INF_FINDINGS:
            return None
        return self.found(finding)

    def _spend(self, calls: int = 0, eager: int = 0) -> None:
        left_calls, left_eager = self._left[0] - calls, self._left[1] - eager
        self._left = (left_calls, left_eager)
        if left_calls <= 0 or left_eager <= 0:
            self.found(self.inf_findings[0], final=True)

    @staticmethod
    def _float_leaf_names(out: Any, name: str, site: SourceLocation | None) -> list[str]:
        targets = _assigned_names(site.file, site.line) if site else None
        names = output_leaf_names(out, targets, name)
        return [n for n, leaf in zip(names, tree_leaves(out)) if is_inexact(leaf)]

    @property
    def calls_after_inf(self) -> int:
        """Jitted calls watched after the first Inf."""
        return self.after_inf - self._left[0] if self.inf_findings else 0

    # -- helpers ---------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return jit_layer.is_internal()

    @staticmethod
    def internal() -> Any:
        """jaxdbg's own work: the eager hook ignores it."""
        return jit_layer.internal()

    def found(self, finding: JitFinding | EagerFinding, final: bool = False) -> int:
        """End the run at ``finding`` (raises), or, for an Inf while ``after_inf`` allows, record it and go on;
        returns its index in :attr:`inf_findings`."""
        if finding.kind == "inf" and self.after_inf > 0 and not final:
            if not self.inf_findings:
                self._left = (self.after_inf, self.after_inf * EAGER_OPS_PER_CALL)
            self.inf_findings.append(finding)
            return len(self.inf_findings) - 1
        if self.finding is None:
            self.finding = finding
        self._residual_passes()
        self.active = False  # nothing after the first finding matters
        raise NonFiniteFound(finding)

    # -- eager operations ----------------------------------------------------------------------------------

    def _on_eager(self, primitive: Any, args: Sequence[Any], params: dict, out: Any, nested: bool) -> None:
        if nested or not self.active or self.busy:
            return
        outs = out if primitive.multiple_results else [out]
        transformed = self._transformed_call(params) if primitive.name in ("jit", "pjit") else None
        self._check_eager(primitive.name, args, outs, lambda *xs: primitive.bind(*xs, **params), transformed)

    def _transformed_call(self, params: dict) -> Transformed | None:
        """For a jitted program run eagerly: the watched function's call it belongs to, if that function was
        transformed outside jit (``jax.grad(loss)(w)`` runs ``loss``'s forward and, later, its transposed program
        as eager ``jit`` operations named ``loss``); else None (jax's own jitted functions, ``jnp.sqrt``)."""
        name = params.get("name")
        calls = [(latest, f.record) for f in self.functions
                 if f.name == name and (latest := f.record.latest_transformed) is not None]
        if not calls:
            return None
        (_, transform, index), record = max(calls, key=lambda c: c[0][0])
        outer = record.transformed_outer if record.transformed_outer != name else None
        return Transformed(str(name), transform, index, record.output_leaves, outer)

    def _on_eager_jit(self, name: str, closed: Any, args: Sequence[Any], outs: list, nested: bool) -> None:
        """A jitted function run eagerly through Python dispatch: jax's own (``jnp.sqrt``), not a watched one."""
        if nested or not self.active or self.busy or not name or name.endswith("_jaxdbg"):
            return
        self._check_eager(name, args, outs, closed)

    def _eager_call_index(self) -> tuple[int | None, SourceLocation | None, types.FrameType | None]:
        """Which call (0-based) of the user function running this eager operation is under way, the user line
        running it, and that line's frame."""
        frame: types.FrameType | None = sys._getframe(2)
        while frame is not None:
            path = frame.f_code.co_filename
            user = self._user_files.get(path)
            if user is None:
                user = self._user_files[path] = is_user_file(path)
            if user:
                break
            frame = frame.f_back
        if frame is None:
            return None, None, None
        latest = self._eager_calls.get(frame.f_code)
        index = 0 if latest is None else latest[1] + (latest[0] is not frame)
        self._eager_calls[frame.f_code] = (frame, index)
        return index, SourceLocation(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name), frame

    def _latest_call_of(self, source: SourceLocation, fallback: int | None) -> int | None:
        """The latest call of the user function that holds ``source``'s line, else ``fallback``. An eager
        ``jax.grad``'s backward operations run from jax's transpose below the frame that called ``jax.grad``
        (whose call count is ``fallback``), but belong to the call of the differentiated function that ran the
        forward pass just before."""
        for code, (_, index) in self._eager_calls.items():
            if code.co_filename == source.file and source.function in (code.co_name, getattr(code, "co_qualname", "")):
                return index
        return fallback

    def _check_eager(self, name: str, args: Sequence[Any], outs: list, program: Any,
                     transformed: Transformed | None = None) -> None:
        call_index, source, frame = self._eager_call_index()
        if name == _compat.PMAP_JIT_NAME and frame is not None:  # a pmap: which call of it at this line
            at = (frame.f_code, frame.f_lineno)
            call_index = self._pmap_calls[at]
            self._pmap_calls[at] += 1
        if not any(is_inexact(o) for o in outs):
            return
        self._remember_maker(outs, source)
        with self.internal():
            self.eager_ops += 1
            checked = [flags_and_magnitude(o) for o in outs]
            out_nan = any(n for n, _, _ in checked)
            out_inf = any(i for _, i, _ in checked)
            if not out_nan and (self.nan_only or not out_inf):
                if self.inf_findings:
                    self._spend(eager=1)
                targets = _assigned_names(source.file, source.line) if source is not None else None
                if frame is not None and targets is not None and len(targets) == 1:  # `w = update(w, ...)`
                    self._eager_updates.seen(frame, targets[0], args, [m for o, (_, _, m) in zip(outs, checked)
                                                                       if is_inexact(o)])
                return
            self.flush()  # unread jitted calls came first: one of them may be the finding (or the Inf fed here)
            leaves = tree_flatten(list(args))[0]
            in_flags = [nonfinite_flags(a) for a in leaves]
            in_nan = any(n for n, _ in in_flags)
            in_inf = any(i for _, i in in_flags)
            created = (out_nan and not in_nan) or (not self.nan_only and out_inf and not in_nan and not in_inf)
            backward = bool(self.inf_findings) and "transpose(" in _compat.current_source_context()[1]
            if not created:
                if self.inf_findings:  # infinities passed on: the outputs hold what the inputs held
                    self._hold(_with_inf(outs, checked), self._infs_in(leaves, backward))
                    self._spend(eager=1)
                return
            kind: OriginKind = "nan" if out_nan and not in_nan else "inf"
            if kind == "inf" and self.inf_findings:  # another Inf birth while waiting for a NaN
                self._spend(eager=1)
                birth = (source, name)
                if birth not in self._births and len(self.inf_findings) >= MAX_INF_FINDINGS:
                    return
                if birth in self._births:
                    self._hold(_with_inf(outs, checked), frozenset({self._births[birth]}))
                    return
            origin = self._eager_origin(name, list(args), program, outs, kind, call_index, transformed)
            feeds = self._infs_in(leaves, backward) if kind == "nan" and in_inf else frozenset()
        index = self.found(EagerFinding(origin, feeds))
        self._births[(source, name)] = (index, None)
        self._hold(_with_inf(outs, checked), frozenset({(index, None)}))

    def _eager_origin(self, name: str, args: list, program: Any, outs: list, kind: OriginKind,
                      call_index: int | None, transformed: Transformed | None = None) -> Origin:
        """The eager operation as an origin. ``program`` (a closed jaxpr, or a function to trace) is replayed
        to name the primitive inside (``jnp.sqrt`` is a jitted function around ``sqrt``). The source is the
        user's line running it now; for a watched function transformed outside jit (``transformed``, see
        :meth:`_transformed_call`), the line of the operation inside it, and the origin is that function's call
        through the transformation (path ``jax.grad(loss)``)."""
        from jaxdbg.nan.localise import localise_call  # the watch itself needs no interpreter

        source, name_stack = _compat.current_source_context()
        source = source or caller_user_frame(3)
        inputs = tuple(value_stats(a) for a in args)
        path: tuple[str, ...] = ("eager",)
        owner: str | None = None
        try:
            closed = program if not callable(program) else jax.make_jaxpr(program)(*args)
            residuals: frozenset[int] = frozenset()
            if transformed is not None and "jvp(" in name_stack and "transpose(" not in name_stack:
                residuals = transformed.residuals(len(closed.jaxpr.outvars))
            inner = localise_call(Call("eager", None, tuple(args), {}, backward_outputs=residuals), self.nan_only,
                                  closed).first
        except Exception:  # noqa: BLE001 - naming the inner primitive is a refinement; the op itself is known
            inner = None
        where: dict[str, Any] = {}
        if inner is not None and inner.kind != "input":
            # A loop body traced just now, or a pmap'd function (a jit of a shard_map of the user's function): its
            # own line is the better answer, and a pmap's origin sits on one device.
            inside = name in ("scan", "while", "cond") or "shard_map" in inner.path
            root = "pmap" if name == _compat.PMAP_JIT_NAME and "shard_map" in inner.path else "eager"
            path = (root, *inner.path[1:]) if inside else ("eager",)
            if transformed is not None:  # inner.path: ('jit(eager)', 'jit(loss)', inside loss...)
                owner, call_index = transformed.function, transformed.index
                inside, path = True, (*transformed.path, *inner.path[2:])
            if inside and inner.source is not None:
                source = inner.source
            if "shard_map" in inner.path:
                where = {"process": inner.process, "device": inner.device, "shard": inner.shard}
            name, inputs = inner.primitive or name, inner.inputs
        backward = "transpose(" in name_stack or (owner is not None and inner is not None and inner.pass_ == "backward")
        if owner is None and source is not None:
            call_index = self._latest_call_of(source, call_index)
        return Origin(
            kind, name, "backward" if backward else "forward", source,
            owner or (source.function if source else "<eager>"),
            call_index if call_index is not None else self.eager_ops - 1,
            path, inputs, None,
            tuple(value_stats(o) for o in outs), name_stack, **where,
        )
