"""Find where a NaN/Inf is born inside one call, by replaying its jaxpr op by op with the interpreter.

Definitions (the contract's): the origin is the first equation, in execution order, whose output holds a
NaN although its inputs hold none; where the program holds Inf but no NaN, the first equation that makes
an Inf from finite inputs. ``chain`` lists where the non-finite inputs of the origin came from.

Every non-finite value carries a :class:`Provenance` tag: which origins it descends from. A non-finite
*constant* written in the code (``jnp.where(mask, x, -jnp.inf)``) is not an input: the first equation that
uses it is where that value enters the program. Loops are first run whole (compiled); only a loop that
would itself be an origin is replayed iteration by iteration, which keeps long clean loops cheap.

The origin is the contract's: the earliest NaN made, in execution order. A select keeps the tags of the cases whose
non-finite elements it selects, so a NaN that exists only where a select discards it (the branch a batch element
does not take when vmap turns a ``lax.cond`` into a select; the masked side of a ``jnp.where``) stops there (a NaN
written in the code as a constant that a select discards, as ``jnp.var`` does with its own ``jnp.nan``, is no origin
at all: the code meant it). When the origin's NaN reaches no output that way, the replay goes on to the first NaN
that does (``Localisation.reaching``), and the origin is said to be discarded (:class:`Discarded`): the NaN in the
outputs is the later one, which ``jax_debug_nans`` never gets to. The replay ends early once the first NaN surely
reaches the outputs (:mod:`jaxdbg.nan.reach`), which is at once for most NaNs.

Example:
    >>> import jax.numpy as jnp
    >>> from jaxdbg.nan.calls import Call
    >>> found = localise_call(Call("f", lambda x: jnp.log(x) * 2, (jnp.array([-1.0, 1.0]),), {}))
    >>> found.first.primitive, found.first.kind
    ('log', 'nan')
    >>> masked = lambda x: jnp.where(x > 0, jnp.log(x), 0.0) + jnp.sqrt(x)   # the log's NaN is masked away
    >>> found = localise_call(Call("f", masked, (jnp.array([-1.0, 1.0]),), {}))
    >>> found.first.primitive, found.reaching.primitive, [d.origin.primitive for d in found.discarded]
    ('log', 'sqrt', ['log'])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdbg import _compat
from jaxdbg._source import SourceLocation
from jaxdbg.jaxpr import Hooks, Interpreter, Scope, Site, Stop
from jaxdbg.nan.calls import Call
from jaxdbg.nan.passes import PassClassifier
from jaxdbg.nan.placement import Placement, first_bad_block, first_bad_shard
from jaxdbg.nan.reach import reaches_outputs
from jaxdbg.nan.result import Origin, OriginKind, Strategy
from jaxdbg.nan.stats import nonfinite_flags, value_stats

LOOPS = ("scan", "while")


@dataclass(frozen=True)
class Provenance:
    """Tag of a non-finite value: what it holds and the origins (indices into the hunter's list) behind it."""

    nan: bool
    inf: bool
    origins: frozenset[int] = frozenset()
    constant: bool = False  # written in the code as a constant, not computed
    # A scan's stacked output: the tag of each iteration's slice, so that a later scan over it (the backward
    # pass over the forward's residuals) sees only what iteration i put there, not every iteration's origins.
    per_iteration: tuple[Provenance | None, ...] | None = None


@dataclass
class Record:
    """An origin as found, with the site kept for later passes (precision, explanation).

    No values are kept (their statistics are in ``origin``): the replay frees each value after its last use,
    and a record holding its inputs would keep activations alive for every Inf origin until the end.
    """

    origin: Origin
    fed_by: tuple[int, ...]
    site: Site | None = None


@dataclass(frozen=True)
class Discarded:
    """A NaN that reached no output of the call, made before the first one that did (the origin's, first): where
    it was made (``origin``), and the select that discarded it (``select``, its line; ``cond``: a
    ``lax.cond``/``lax.switch`` that vmap turned into a select), or None for both when it was left behind
    another way (a slice, a comparison)."""

    origin: Origin
    select: SourceLocation | None = None
    cond: bool = False
    dropped_at_select: bool = False

    def note(self, reaching: Origin | None) -> str:
        """One line for the report's notes (``reaching``: the first NaN made that reaches the outputs)."""
        later = ""
        if reaching is not None:
            inside = (f" inside {' > '.join(reaching.path[1:])}" if reaching.path[1:]
                      and reaching.path != self.origin.path else "")  # the same line in a while's cond and body
            later = f"; the NaN in the outputs is made later, by {_made_by(reaching)}{inside} ({reaching.pass_} pass)"
        return f"the NaN made by {_made_by(self.origin)} reaches no output: it was made {self.how()}{later}"

    def how(self) -> str:
        """How it was left behind, in words."""
        at = f" at line {self.select.line}" if self.select else ""
        if self.cond:
            return (f"in a branch of the cond{at} that vmap computes for every batch element, and the select it "
                    "became discarded it (those elements take another branch; jax keeps it out of the gradient too)")
        if self.dropped_at_select:
            return f"and the select{at} (e.g. a `jnp.where`) discarded it"
        return "and nothing computed later holds it"


def _made_by(origin: Origin) -> str:
    source = origin.source
    return f"`{origin.primitive}`" + (f" at {source.file.rsplit('/', 1)[-1]}:{source.line}" if source else "")


@dataclass
class Localisation:
    """What one replay found: the origin, its chain, and how it was found."""

    first: Origin | None
    chain: tuple[Origin, ...]
    strategy: Strategy | None
    reproduced: bool  # the replay's outputs were non-finite too
    record: Record | None = None
    notes: tuple[str, ...] = ()
    closed_jaxpr: Any = None
    # Per reported origin (first, then chain): the user lines that computed its inputs, for the explanation
    # (``log(probs)`` reads differently when ``probs`` came from a ``softmax`` line).
    input_sources: dict[Origin, tuple[SourceLocation, ...]] | None = None
    # Every Inf made from finite inputs before the origin (records, with their sites): where a value may have
    # left its dtype's range (jaxdbg.nan.overflow).
    infs: tuple[Record, ...] = ()
    # When the origin's NaN reaches no output (a select discarded it): that NaN and the others made before the
    # first NaN that does, earliest first; and that first NaN, which made the outputs non-finite.
    discarded: tuple[Discarded, ...] = ()
    reaching: Origin | None = None


def _vmap_marked(site: Site) -> tuple[str, ...]:
    """The site's path, with the custom_vjp backward rule it runs in and ``vmap`` where the user's vmap maps it:
    around the loop or call it was written around (``jit(f) > vmap > scan[iteration=0]``), else innermost."""
    path = list(site.path)
    name_stack = site.name_stack
    if "custom_vjp_bwd(" in name_stack:
        start = name_stack.index("custom_vjp_bwd(")
        path.append(name_stack[start:name_stack.index(")", start) + 1])
    mapped = _users_vmap(site)
    if mapped is not None:
        path.insert(len(path) if mapped is site else min(len(mapped.scope.path), len(site.path)), "vmap")
    return tuple(path)


def _users_vmap(site: Site) -> Site | None:
    """The outermost equation, the site or one enclosing it, that a ``jax.vmap`` of the user's maps: its name stack
    reads ``vmap(`` in a jaxpr not traced from one of jax's own functions. A name stack is relative to its jaxpr:
    the vmap jax's own functions apply inside their jits (``jnp.linalg.solve`` vmaps its ``custom_linear_solve``)
    shows only there, and a user's vmap around a call of a jit (a loop) shows only outside it. (jax's un-jitted
    helpers that vmap, such as ``jax.jacrev``, leave their vmap in the user's jaxpr: still marked.) None if none."""
    found: Site | None = None
    at: Site | None = site
    while at is not None:
        if "vmap(" in at.name_stack and not _compat.jaxpr_from_jax(at.scope.jaxpr):
            found = at
        at = at.scope.parent
    return found


class NanHunter(Hooks):
    """Interpreter hooks that record origins and tag values with their provenance.

    Args:
        function: name of the function being replayed (for the report).
        call_index: which call of it this is.
        nan_only: ignore Inf (only a NaN counts as non-finite).
        stop_at_first_nan: end the replay once the first NaN origin surely reaches the call's outputs (else go
            on to the first NaN that does).
        root: the path's first element (``jit(function)`` unless given: ``pmap`` for a pmap'd call).
        backward_outputs: positions of the outputs only a later backward pass reads (see :class:`PassClassifier`).
    """

    def __init__(self, function: str, call_index: int = 0, nan_only: bool = False, stop_at_first_nan: bool = True,
                 root: str | None = None, backward_outputs: frozenset[int] = frozenset(), infs_only: bool = False):
        self.function = function
        self.infs_only = infs_only
        self.root = root or f"jit({function})"
        self.call_index = call_index
        self.nan_only = nan_only
        self.stop_at_first_nan = stop_at_first_nan
        self.records: list[Record] = []
        self.first_nan: int | None = None
        self.confirmed: set[int] = set()  # NaN origins known to reach the call's outputs
        self.dropped: dict[int, Site] = {}  # origin -> the select that discarded its non-finite values first
        self.passes = PassClassifier(backward_outputs)
        self.opaque_notes: list[tuple[Site, str]] = []
        self.reaching: frozenset[int] = frozenset()
        self.chosen: int | None = None
        self.later: int | None = None  # the first NaN origin that reaches the outputs, when the chosen one does not
        self._literal_tags: dict[int, Provenance | None] = {}
        self._slices: dict[int, tuple[set, int]] = {}

    # -- inputs and constants ------------------------------------------------------------------------------

    def input_tags(self, leaves: Sequence[Any], names: Sequence[str]) -> list:
        """Tags for the call's arguments; a non-finite argument becomes an ``input`` origin."""
        tags = []
        for value, name in zip(leaves, names):
            nan, inf = nonfinite_flags(value)
            tags.append(self._input_origin(value, name, nan, inf) if (nan or inf) else None)
        return tags

    def _input_origin(self, value: Any, name: str, nan: bool, inf: bool) -> Provenance:
        stats = value_stats(value)
        origin = Origin("input", None, "forward", None, self.function, self.call_index, (self.root,),
                        (stats,), argument=name, outputs=(stats,))
        self.records.append(Record(origin, ()))
        return Provenance(nan, inf, frozenset({len(self.records) - 1}))

    def literal_tag(self, literal: Any) -> Provenance | None:
        key = id(literal)
        if key not in self._literal_tags:
            nan, inf = nonfinite_flags(np.asarray(literal.val))
            self._literal_tags[key] = Provenance(nan, inf, constant=True) if (nan or inf) else None
        return self._literal_tags[key]

    def const_tags(self, scope: Scope, consts: list) -> list:
        """Constants of inner jaxprs were written in the code; arrays the function captured (closure,
        globals) are the root jaxpr's constants and count as inputs."""
        tags: list[Provenance | None] = []
        for i, value in enumerate(consts):
            nan, inf = nonfinite_flags(value)
            if not (nan or inf):
                tags.append(None)
            elif scope.parent is None and np.ndim(value) > 0:
                tags.append(self._input_origin(value, f"captured array #{i} {tuple(np.shape(value))}", nan, inf))
            else:
                tags.append(Provenance(nan, inf, constant=True))
        return tags

    # -- per equation --------------------------------------------------------------------------------------

    def before(self, site: Site, invals: list, in_tags: list) -> list | None:
        """Run a loop whole first; replay it op by op only if, run whole, it would be an origin."""
        if site.primitive not in LOOPS or any(s.scope.kind == "shard_map" for s in (site, *site.enclosing())):
            return None
        outs = _compat.bind_eqn(site.eqn, invals)
        in_nan, in_inf = self._input_state(self._resolved(site, invals, in_tags))
        out_nan, out_inf = self._output_state(outs)
        if self._is_new(in_nan, in_inf, out_nan, out_inf):
            return None
        return outs

    def after(self, site: Site, invals: list, outvals: list, in_tags: list, out_tags: list,
              descended: bool) -> list | None:
        if descended:
            self._vouch(site, outvals, out_tags)
            return None
        resolved = None
        if site.primitive == "select_n" and any(t is not None for t in in_tags[1:]):  # what it discards, first
            resolved = self._selected(site, invals, self._resolved(site, invals, in_tags))
        flags = [nonfinite_flags(v) for v in outvals]
        if not any(nan or inf for nan, inf in flags):
            return None
        in_tags = resolved if resolved is not None else self._resolved(site, invals, in_tags)
        if _folds_nan_constant(site, in_tags):
            # still a constant (jnp.var's NaN, broadcast): jax hoists such values out of a loop for its backward
            # pass, and the loop's select that discards it must see a constant there, not a computed NaN
            return [Provenance(nan, inf, constant=True) if (nan or inf) else None for nan, inf in flags]
        in_nan, in_inf = self._input_state(in_tags)
        out_nan = any(nan for nan, _ in flags)
        out_inf = any(inf for _, inf in flags)
        fed = frozenset().union(*(t.origins for t in in_tags if t is not None))
        new: set[int] = set()
        if out_nan and not in_nan:
            new.add(self._record("nan", site, invals, outvals, in_tags, fed))
        elif out_inf and not in_nan and not in_inf:
            new.add(self._record("inf", site, invals, outvals, in_tags, fed))
        tags = [Provenance(nan, inf, fed | frozenset(new)) if (nan or inf) else None for nan, inf in flags]
        if new and self.records[min(new)].origin.kind == "nan" and self.first_nan is None:
            self.first_nan = min(new)
        self._vouch(site, outvals, tags)
        return tags

    def _vouch(self, site: Site, outvals: list, tags: Sequence[Any]) -> None:
        """Note (and stop, if asked) once a result holding the first NaN origin's NaN surely reaches the call's
        outputs: nothing later is needed then. While it may still be discarded, the replay goes on (to the end:
        which later NaN reaches the outputs first is known only there)."""
        first = self.first_nan
        if first is None or first in self.confirmed:
            return
        positions = [p for p, (tag, value) in enumerate(zip(tags, outvals))
                     if tag is not None and first in tag.origins and tag.nan and nonfinite_flags(value)[0]]
        if positions and reaches_outputs(site, positions):
            self.confirmed.add(first)
            if self.stop_at_first_nan:
                raise Stop()

    def _selected(self, site: Site, invals: list, in_tags: list) -> list:
        """A select's input tags, those of cases whose non-finite elements it does not select left out: what it
        discards reaches nothing through it (the branch a batch element does not take, a masked-away value)."""
        which, resolved = invals[0], list(in_tags)
        for case, (value, tag) in enumerate(zip(invals[1:], in_tags[1:]), start=1):
            if tag is None or selected_nonfinite(which, value, case - 1):
                continue
            resolved[case] = None
            for origin in tag.origins:
                self.dropped.setdefault(origin, site)
        return resolved

    def opaque(self, site: Site, reason: str) -> None:
        self.opaque_notes.append((site, f"{'/'.join(site.path)}: {reason}"))

    def merge_tags(self, tags: Sequence[Any]) -> Provenance | None:
        """A scan's stacked output holds what every iteration put there; each slice keeps its own tag."""
        tags = list(tags)
        set_ = [t for t in tags if t is not None]
        if not set_:
            return None
        return Provenance(any(t.nan for t in set_), any(t.inf for t in set_),
                          frozenset().union(*(t.origins for t in set_)), all(t.constant for t in set_), tuple(tags))

    def _resolved(self, site: Site, invals: list, in_tags: list) -> list:
        """The tags of this equation's inputs as they are here: a slice of a stacked scan output gets its
        iteration's tag, and a computed value that holds no NaN/Inf any more (a finite slice, a finite part
        selected out) gets none, so it neither hides an origin nor joins a chain it did not feed."""
        xs = self._scan_slices(site.scope)
        resolved = []
        for atom, value, tag in zip(site.eqn.invars, invals, in_tags):
            if tag is not None and tag.per_iteration is not None and xs and atom in xs[0] \
                    and len(tag.per_iteration) == xs[1]:
                tag = tag.per_iteration[site.scope.iteration]
            if tag is not None and not tag.constant:
                nan, inf = nonfinite_flags(value)
                if not (nan or inf):
                    tag = None
                elif (nan, inf) != (tag.nan, tag.inf):
                    tag = replace(tag, nan=nan, inf=inf)
            resolved.append(tag)
        return resolved

    def _scan_slices(self, scope: Scope) -> tuple[set, int] | None:
        """The body variables that hold one slice of the scanned-over arrays, and the scan's length."""
        if scope.kind != "scan" or scope.parent is None or scope.iteration is None:
            return None
        key = id(scope.parent.eqn)
        if key not in self._slices:
            params = scope.parent.eqn.params
            n_consts, n_carry = _compat.scan_split(params)
            self._slices[key] = (set(list(scope.jaxpr.invars)[n_consts + n_carry:]), int(params["length"]))
        return self._slices[key]

    # -- helpers -------------------------------------------------------------------------------------------

    @staticmethod
    def _input_state(in_tags: list) -> tuple[bool, bool]:
        computed = [t for t in in_tags if t is not None and not t.constant]
        return any(t.nan for t in computed), any(t.inf for t in computed)

    @staticmethod
    def _output_state(outs: list) -> tuple[bool, bool]:
        flags = [nonfinite_flags(v) for v in outs]
        return any(n for n, _ in flags), any(i for _, i in flags)

    def _is_new(self, in_nan: bool, in_inf: bool, out_nan: bool, out_inf: bool) -> bool:
        if out_nan and not in_nan:
            return True
        return out_inf and not in_nan and not in_inf

    def _record(self, kind: OriginKind, site: Site, invals: list, outvals: list, in_tags: list,
                fed: frozenset[int]) -> int:
        inputs = tuple(value_stats(_typed(atom, v)) for atom, v in zip(site.eqn.invars, invals))
        outputs = tuple(value_stats(v) for v in outvals)
        name_stack = site.name_stack
        where = _placement(site, outvals)
        origin = Origin(
            kind, site.primitive, self.passes.pass_of(site), site.source, self.function, self.call_index,
            _vmap_marked(site), inputs, None, outputs, name_stack,
            constant_input=any(t is not None and t.constant for t in in_tags),
            process=where.process if where else None, device=where.device if where else None,
            shard=where.index if where else None,
        )
        self.records.append(Record(origin, tuple(sorted(fed)), site))
        return len(self.records) - 1

    # -- the answer ----------------------------------------------------------------------------------------

    def conclude(self, out_tags: Sequence[Any]) -> tuple[Record | None, tuple[Record, ...]]:
        """The origin by the contract's rules (the earliest NaN made, in execution order), and its chain (earliest
        first); when its NaN reaches no output, the first NaN that does is noted (``later``)."""
        reaching = frozenset().union(*(t.origins for t in out_tags if t is not None), self.confirmed)
        self.reaching = reaching
        chosen: int | None = self.first_nan
        if chosen is not None and (self.infs_only or (out_tags and not self.confirmed
                                   and not any(t is not None and t.nan for t in out_tags))):
            # The outputs hold Inf and no NaN: every NaN made was left behind (jax's own xlogy computes
            # 0 * log(0) and selects 0 there), and an operation passing both on reaches them only by its Inf;
            # or the compiled call held no NaN (``infs_only``) where op by op makes one (XLA computes
            # x * one_hot as a select, op by op is 0 * inf): the program's answer is its Inf.
            chosen = None
        if chosen is None:
            chosen = self._first_of(reaching, "input", need_nan=True)
        if chosen is None and not self.nan_only:
            chosen = next((i for i, r in enumerate(self.records) if r.origin.kind == "inf"), None)
            if chosen is None:
                chosen = self._first_of(reaching, "input", need_nan=False)
        while chosen is not None and chosen not in reaching and _passes_nan_constant(self.records[chosen].origin):
            chosen = next((i for i in range(chosen + 1, len(self.records)) if self.records[i].origin.kind == "nan"),
                          None)
        self.chosen = chosen
        if chosen is not None and chosen not in reaching and self.records[chosen].origin.kind == "nan":
            self.later = self._first_of(reaching, "nan", need_nan=False)
        if chosen is None:
            return None, ()
        record = self.records[chosen]
        chain = tuple(self.records[i] for i in record.fed_by if self.records[i].origin.kind in ("inf", "input"))
        return record, chain

    def discarded(self) -> tuple[Discarded, ...]:
        """When the chosen origin's NaN reaches no output (after :meth:`conclude`): it, and the NaN origins after it
        that reach none either, up to the first that does."""
        chosen = self.chosen
        if chosen is None or chosen in self.reaching or self.records[chosen].origin.kind != "nan":
            return ()
        found = []
        for i, record in enumerate(self.records[chosen:], start=chosen):
            if self.later is not None and i >= self.later:
                break
            if record.origin.kind == "nan" and i not in self.reaching and not _passes_nan_constant(record.origin):
                select = self.dropped.get(i)
                found.append(Discarded(record.origin, select.source if select else None,
                                       select is not None and _compat.is_batched_cond_select(select.eqn),
                                       select is not None))
        return tuple(found)

    def _first_of(self, ids: frozenset[int], kind: str, need_nan: bool) -> int | None:
        for i in sorted(ids):
            origin = self.records[i].origin
            if origin.kind == kind and (not need_nan or origin.outputs[0].nan):
                return i
        return None


def _passes_nan_constant(origin: Origin) -> bool:
    """An operation that only passes on a NaN written in the code (``jnp.nan``: jax's own ``jnp.var`` selects one
    for an empty reduction, under ``debug_nans(False)``). Where a select then discards it, it is no origin: the
    code meant it, and nothing sees it."""
    return origin.kind == "nan" and origin.constant_input and any(s.nan for s in origin.inputs)


def _folds_nan_constant(site: Site, in_tags: Sequence[Any]) -> bool:
    """An operation of constants only, one of them a NaN written in the code (``convert_element_type`` or
    ``broadcast_in_dim`` of ``jnp.nan``): its result is a constant too, no origin, until something selects it into
    a computed value (an Inf constant stays an origin: a ``-inf`` mask is the head of a chain)."""
    if not any(t is not None and t.nan for t in in_tags):
        return False
    return all((t is not None and t.constant and not t.inf) or (t is None and _compat.is_literal(atom))
               for atom, t in zip(site.eqn.invars, in_tags))


@jax.jit
def _selected_flags_jaxdbg(which: Any, case: Any, index: Any) -> Any:
    chosen = jnp.broadcast_to(which.astype(jnp.int32) == index, case.shape)
    return jnp.any((jnp.isnan(case) | jnp.isinf(case)) & chosen)


def selected_nonfinite(which: Any, case: Any, index: int) -> bool:
    """Whether a select with predicate ``which`` takes a NaN/Inf of ``case`` (its case number ``index``).

    Example:
        >>> which = np.array([True, False])   # select_n takes case 1 where it is True
        >>> selected_nonfinite(which, np.array([np.nan, 1.0]), 1), selected_nonfinite(which, np.array([1.0, np.nan]), 1)
        (True, False)
    """
    case = jnp.asarray(case)
    if not jnp.issubdtype(case.dtype, jnp.inexact):
        return False
    which = jnp.asarray(which)
    if which.ndim < case.ndim:  # a scalar predicate; or one value per device, stacked, in a shard_map replay
        which = which.reshape(which.shape + (1,) * (case.ndim - which.ndim))
    try:
        return bool(_selected_flags_jaxdbg(which, case, index))
    except (TypeError, ValueError):  # shapes this reading does not follow: the case counts as selected
        return True


def _placement(site: Site, outvals: list) -> Placement | None:
    """Where an origin's first non-finite value sits: the device (and its block of a global array) inside a
    shard_map or pmap body, whose values hold every device's block; else the shard of a global array."""
    mapped = next((s for s in reversed(site.enclosing()) if s.primitive == "shard_map"), None)
    if mapped is None:
        return first_bad_shard(outvals)
    layout = _compat.shard_map_layout(mapped.eqn.params)
    if layout is None:
        return None
    sizes, in_specs, out_specs, manual = layout
    atoms = [*mapped.eqn.invars, *mapped.eqn.outvars]
    operands = [(tuple(a.aval.shape), spec) for a, spec in zip(atoms, (*in_specs, *out_specs)) if hasattr(a, "aval")]
    return first_bad_block(outvals, sizes, manual, getattr(mapped.eqn.params.get("mesh"), "devices", None), operands)


def input_sources(site: Site) -> tuple[SourceLocation, ...]:
    """The user lines that computed the inputs of the equation at ``site``, each once (an input of an
    enclosing jit or custom rule is followed out to the operand that fed it). An input computed on the origin's own
    line is followed further back, to the lines that fed it (``jnp.log(1 - probs)``: where ``probs`` was made)."""
    found: list[SourceLocation] = []
    own = _compat.eqn_source(site.eqn)
    pending = [(site.scope, site.index, atom) for atom in site.eqn.invars]
    for _ in range(32):  # a line's own equations, followed back a bounded number of steps
        if not pending:
            break
        scope, index, atom = pending.pop(0)
        producer = None if _compat.is_literal(atom) else _producer(scope, index, atom)
        if producer is None:
            continue
        line = _compat.eqn_source(producer[0].jaxpr.eqns[producer[1]])
        if line is not None and line not in found:
            found.append(line)
        if line is not None and line == own:
            pending += [(producer[0], producer[1], a) for a in producer[0].jaxpr.eqns[producer[1]].invars]
    return tuple(found)


def _producer(scope: Scope, index: int, atom: Any) -> tuple[Scope, int] | None:
    """The equation (its scope and index) before ``index`` that made ``atom``, followed out of enclosing calls."""
    while True:
        for made_at in range(index - 1, -1, -1):
            if any(atom is out for out in scope.jaxpr.eqns[made_at].outvars):
                return scope, made_at
        invars = list(scope.jaxpr.invars)
        position = next((i for i, var in enumerate(invars) if var is atom), None)
        parent = scope.parent
        if parent is None or scope.kind != "call" or position is None or position >= len(parent.eqn.invars):
            return None  # an argument of the call, a constant, or a loop's carry: no single line made it
        atom = parent.eqn.invars[position]
        if _compat.is_literal(atom):
            return None
        scope, index = parent.scope, parent.index


def _typed(atom: Any, value: Any) -> Any:
    """A literal's value with the dtype the jaxpr gives it (Python floats would read as float64)."""
    if _compat.is_literal(atom) and not hasattr(value, "dtype"):
        dtype = getattr(getattr(atom, "aval", None), "dtype", None)
        return np.asarray(value, dtype=dtype) if dtype is not None else np.asarray(value)
    return value


def trace_for_replay(call: Call) -> Any:
    """The call's closed jaxpr, traced so that it keeps the lines of user ``custom_vjp`` backward rules and
    ``custom_jvp`` rules under remat; jax's trace caches are cleared first so nested functions traced earlier
    (without that) are traced again."""
    jax.clear_caches()
    with _compat.custom_vjp_backward_sources(), _compat.custom_jvp_rule_sources():
        return call.trace()


def replay(call: Call, nan_only: bool = False, closed: Any = None,
           infs_only: bool = False) -> tuple[NanHunter, list, list, Any]:
    """Trace ``call`` and interpret it op by op under a :class:`NanHunter`; returns (hunter, outs, tags, jaxpr).

    ``closed``: the call's jaxpr if already traced (by :func:`trace_for_replay`), else traced here;
    ``infs_only``: the call's compiled outputs held Inf and no NaN (a NaN of the replay is not the answer).
    """
    if closed is None:
        closed = trace_for_replay(call)
    hunter = NanHunter(call.name, call.call_index, nan_only, stop_at_first_nan=not infs_only, root=call.root,
                       backward_outputs=call.backward_outputs, infs_only=infs_only)
    leaves = call.leaves()
    tags = hunter.input_tags(leaves, call.leaf_names())
    interp = Interpreter(hunter)
    try:
        outs, out_tags = interp.run(closed, leaves, root=call.root, tags=tags)
    except Stop:
        outs, out_tags = [], []
    return hunter, outs, out_tags, closed


def _telling_opaque_notes(notes: list[tuple[Site, str]], found: Sequence[Any]) -> list[str]:
    """The notes of operations run whole that matter: all of them when no origin was found (one may hide it), else
    those of an origin or a link of its chain (the answer stops at them); a scatter-add inside ``take_along_axis``
    that had nothing to do with the NaN is no news to the user."""
    sites = [r.site for r in found if r is not None and r.site is not None]
    if not sites:
        return list(dict.fromkeys(text for _, text in notes))
    return list(dict.fromkeys(text for site, text in notes  # each once: two solves at one path read the same
                              if any(s is site or (s.path == site.path and s.primitive == site.primitive)
                                     for s in sites)))


def localise_call(call: Call, nan_only: bool = False, closed: Any = None, infs_only: bool = False) -> Localisation:
    """Op-by-op replay of one call; see :mod:`jaxdbg.nan.fidelity` for when it does not reproduce. ``infs_only``:
    its compiled outputs held Inf and no NaN, so the origin is an Inf's."""
    hunter, outs, out_tags, closed = replay(call, nan_only, closed, infs_only)
    record, chain = hunter.conclude(out_tags)
    reproduced = bool(hunter.confirmed) or any(
        nan or (inf and not nan_only) for nan, inf in (nonfinite_flags(v) for v in outs))
    if record is not None and not reproduced and record.origin.kind != "input":
        record, chain = None, ()  # only masked-away origins: not what made the outputs non-finite
    strategy: Strategy | None = None
    if record is not None:
        strategy = "input check" if record.origin.kind == "input" else "op-by-op replay"
    sources = {r.origin: input_sources(r.site) for r in (record, *chain) if r is not None and r.site is not None}
    discarded = hunter.discarded() if record is not None else ()
    reaching = hunter.records[hunter.later].origin if discarded and hunter.later is not None else None
    return Localisation(
        record.origin if record else None, tuple(r.origin for r in chain), strategy, reproduced, record,
        (*(d.note(reaching) for d in discarded[:1]), *_telling_opaque_notes(hunter.opaque_notes, (record, *chain))),
        closed, sources,
        tuple(r for r in hunter.records if r.origin.kind == "inf"), discarded, reaching,
    )


def origins_of_outputs(call: Call, positions: Sequence[int], nan_only: bool = False,
                       closed: Any = None) -> tuple[list[Origin], dict[Origin, tuple[SourceLocation, ...]]]:
    """Every origin behind the non-finite values of some outputs of a call (positions in its flat outputs),
    earliest first, with the lines that computed their inputs; empty when the replay does not reach them
    (e.g. it stopped at a NaN that was masked away)."""
    hunter, _, out_tags, _ = replay(call, nan_only, closed)
    reaching = frozenset().union(*(out_tags[p].origins for p in positions
                                   if p < len(out_tags) and out_tags[p] is not None))
    records = [hunter.records[i] for i in sorted(reaching) if hunter.records[i].origin.kind in ("inf", "input")]
    return [r.origin for r in records], {r.origin: input_sources(r.site) for r in records if r.site is not None}
