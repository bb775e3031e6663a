"""The ``zero`` analysis: where the zero came from that the origin divided by (or took the log of).

"0 / 0 at line 8" is where the NaN is born; what to fix is usually where the 0 was made: an ``exp`` of a
parameter that one bad update sent to -377 underflows to 0 three lines earlier, a ``sum`` of a mask that is
all padding, ``x - x``, a ``segment_sum`` whose segment nothing points at. The origin's zero operand is
followed back through the equations that computed it, with the values they held in one more replay of the
call up to the origin, to the operation that made a zero from inputs that held none (an underflow, a
cancellation, an empty segment), to an array the function captured (a global schedule holding a 0), or to the
argument of the call that brought it in. It is followed out of the jaxpr the origin is in, through a nested
call's operands and a loop's constants (a kernel computed once before a ``while_loop``), and through a loop's
carry only in its first iteration (where the carry is the loop's initial value; later, an earlier iteration's);
and into a nested call that made the zero from inputs without any (``jnp.std`` of a constant column, jitted inside
jax: its ``x - mean`` cancels), whose body is retraced on the inputs it had, at the line that called it.
A zero written into the code (``step / WARMUP`` with ``WARMUP = 0``: a literal of the traced program) is said so.
Where the origin is arithmetic on an infinity a division by zero made (``0 * inf`` in a later line), that
division's zero is the one followed.

Example:
    >>> import jax.numpy as jnp
    >>> from jaxdbg.nan.analyses import Findings
    >>> from jaxdbg.nan.calls import Call
    >>> from jaxdbg.nan.localise import localise_call
    >>> call = Call("f", lambda x, s: x / jnp.exp(s) ** 2, (jnp.float32(0.0), jnp.float32(-377.0)), {})
    >>> found = localise_call(call)
    >>> findings = Findings(found.first, call=call, localisation=found)
    >>> analyse(findings)
    >>> findings.zero_source.primitive, findings.zero_source.how, findings.zero_source.arguments
    ('exp', 'underflow', ('s',))
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxdbg import _compat
from jaxdbg._source import SourceLocation
from jaxdbg.jaxpr import Hooks, Interpreter, Scope, Site, Stop
from jaxdbg.nan.result import Origin, ValueStats
from jaxdbg.nan.stats import value_stats

if TYPE_CHECKING:
    from jaxdbg.nan.analyses import Findings

# primitive -> which operand a zero makes it non-finite
ZERO_OPERAND = {"div": 1, "rem": 1, "log": 0, "rsqrt": 0, "pow": 0, "integer_pow": 0}
UNDERFLOWS = ("exp", "exp2", "mul", "integer_pow", "pow", "square", "div", "dot_general", "logistic", "sqrt")
CANCELS = ("sub", "add", "add_any", "reduce_sum")
DIVISOR = re.compile(r"(?<![/*])[/%]\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?![\w.]|\s*[(\[])")  # `/ NAME`, not `/ f(x)`
COMPARES = ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not")  # a False is made here, whatever went in


SCATTERS = ("scatter-add", "scatter_add")  # segment_sum, .at[i].add: where no index lands, the initial 0 stays
INDEXED = {"gather": (0,), "dynamic_slice": (0,), "dynamic_update_slice": (0, 1)}  # the operands that are values
# The operands whose zeros can make a zero of the result, where not all can: exp(0) is 1, so a zero out of ``exp``
# was made there (an underflow) even where its input held zeros too (softmax's ``x - max(x)`` is 0 at the maximum);
# x / 0 is not 0, a zero numerator is.
ZERO_FROM: dict[str, tuple[int, ...]] = {
    "div": (0,), "rem": (0,), "pow": (0,), "atan2": (0,), "exp": (), "exp2": (), "cos": (), "cosh": (), "logistic": (),
    "log": (), "rsqrt": (), "erfc": ()}


@dataclass(frozen=True)
class ZeroSource:
    """Where the zero operand of ``of`` (the origin, or the division whose infinity the origin's arithmetic passed
    on) was made: by ``primitive`` at ``source`` from ``inputs`` (``how``: ``underflow``, ``cancellation``,
    ``empty`` (a scatter-add where no index landed: ``zeros`` of its ``size`` entries) or ``made``), held by an
    array the function captured (``captured``: ``name`` where a global of the user's module is that array, and
    the ``index`` of its first zero), or brought in by an argument of the call (``primitive`` None, ``how``
    ``argument``), by a loop's carry (``outside``) or written into the traced code (``literal``: a Python
    number, ``name`` the identifier the origin's line divides by where it reads one); ``arguments``: the call's
    arguments it was computed from."""

    primitive: str | None
    source: SourceLocation | None
    how: str
    inputs: tuple[ValueStats, ...] = ()
    arguments: tuple[str, ...] = ()
    of: Origin | None = None
    name: str | None = None
    index: tuple[int, ...] | None = None
    zeros: int = 0
    size: int = 0


def analyse(findings: Findings) -> None:
    """Set ``findings.zero_source`` when the origin is a division by zero (or log/rsqrt/pow of 0), or arithmetic on
    an infinity that a division by zero in the same call made."""
    first, found, call = findings.first, findings.localisation, findings.call
    if first is None or first.kind == "input" or found is None or call is None or call.fun is None \
            or found.closed_jaxpr is None:
        return
    record = getattr(found, "record", None)
    if not _divides_by_zero(first):
        root = next((c for c in findings.chain if c.kind == "inf"), None)
        if root is None or not any(s.inf for s in first.inputs) or not _divides_by_zero(root) \
                or (root.function, root.call_index) != (first.function, first.call_index):
            return
        record = next((r for r in getattr(found, "infs", ()) if r.origin == root), None)
    if record is None or record.site is None:
        return
    findings.zero_source = trace_zero(call, found.closed_jaxpr, record.site, ZERO_OPERAND[record.origin.primitive],
                                      record.origin, findings.globals_named)


def _divides_by_zero(origin: Origin) -> bool:
    operand = ZERO_OPERAND.get(origin.primitive or "")
    return operand is not None and operand < len(origin.inputs) and bool(origin.inputs[operand].zero)


@dataclass(frozen=True)
class _Level:
    """One jaxpr the zero is followed through: the origin's, then each that encloses it, as far as a value
    maps out (``site``: the equation of this jaxpr the trace starts before; ``needed``: the slice recorded)."""

    site: Site
    producers: dict[int, int]
    needed: frozenset[int]


def trace_zero(call: Any, closed: Any, origin: Site, operand: int, of: Origin | None = None,
               named: Mapping[int, str] | None = None, depth_left: int = 4) -> ZeroSource | None:
    """Follow the zero in operand ``operand`` of the equation at ``origin`` back to where it was made (``named``:
    the script's global arrays by ``id``, for those its globals no longer hold); into a nested call that made it
    from inputs without zeros, ``depth_left`` calls deep."""
    levels = _levels(origin, origin.eqn.invars[operand])
    seen = _Recorder(origin, operand, levels)
    with contextlib.suppress(Stop):  # the replay ends at the origin
        Interpreter(seen).run(closed, call.leaves(), root=call.root)
    if not seen.reached:
        return None
    names = call.leaf_names()
    var, depth = origin.eqn.invars[operand], 0
    for _ in range(sum(len(level.site.scope.jaxpr.eqns) for level in levels) + len(levels) + 1):
        level = levels[depth]
        scope, jaxpr = level.site.scope, level.site.scope.jaxpr
        index = level.producers.get(id(var))
        if index is None and _compat.is_literal(var):
            return ZeroSource(None, None, "literal", (), (), of, name=_divisor_name(origin))
        if index is None:
            outer = _maps_out(level.site, var)
            if outer is not None and depth + 1 < len(levels):
                var, depth = outer, depth + 1
                continue
            position = next((i for i, v in enumerate(jaxpr.constvars) if v is var), None)
            if position is not None:
                return _captured(call, seen.consts.get(depth), position, of, named or {})
            how = "argument" if _is_argument(level.site, var) else "outside"  # a loop's carry: an earlier iteration
            return ZeroSource(None, None, how, (), _arguments(level.site, [var], names), of)
        eqn, (ins, outs) = jaxpr.eqns[index], seen.stats[depth][index]
        name = eqn.primitive.name
        followed: Sequence[int] = INDEXED[name] if name in INDEXED else ZERO_FROM.get(name, range(len(ins)))
        if name in SCATTERS:  # the operand's zeros stay where no update lands; zero updates add a zero
            followed = (2,) if len(ins) > 2 and ins[2] is not None and ins[2].zero else ()
        masks, output = seen.zeros[depth].get(index), next(k for k, out in enumerate(eqn.outvars) if out is var)
        zero_inputs = [i for i, stats in enumerate(ins) if i in followed and stats is not None and stats.zero
                       and name not in COMPARES and not (name == "select_n" and i == 0)
                       and _overlapping(masks, i, output)]
        if not zero_inputs:
            here = Site(eqn, index, scope)
            arguments = _arguments(here, list(eqn.invars), names)
            inner = _inside_call(call, closed, here, output, depth_left) if name in CALLS else None
            if inner is not None:  # a jitted function (jnp.std, a helper of the user's) made it: say which op inside
                return dataclasses.replace(inner, arguments=arguments, of=of,
                                           source=inner.source or _compat.eqn_source(eqn) or here.source)
            how = "empty" if name in SCATTERS else _how(name, ins)
            return ZeroSource(name, _compat.eqn_source(eqn) or here.source, how, tuple(s for s in ins if s is not None),
                              arguments, of, zeros=outs[0].zero if outs else 0,
                              size=_size(outs[0].shape) if outs else 0)
        var = eqn.invars[zero_inputs[0]]
    return None


# Calls whose outputs are their jaxpr's outputs, one for one: a zero made inside one is followed in.
CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat2", "checkpoint",
         "eval_jaxpr")


class _Inputs(Hooks):
    """Replays the call up to one equation (``site``, by its jaxpr, place and index) and keeps its input values."""

    def __init__(self, site: Site):
        self.site = site
        self.values: list | None = None

    def before(self, site: Site, invals: list, in_tags: list) -> list | None:
        if site.index == self.site.index and site.scope.jaxpr is self.site.scope.jaxpr and site.path == self.site.path:
            self.values = list(invals)
            raise Stop()
        return None


def _inside_call(call: Any, closed: Any, site: Site, output: int, depth_left: int) -> ZeroSource | None:
    """Where inside the call at ``site`` its output ``output`` got the zero it holds, although no input of the call
    is 0 there (jnp.std of a constant column: ``x - mean`` cancels inside ``_std``). Its inputs are taken from one
    more replay; its jaxpr, retraced on them with each equation under its own source line, ends in a division by
    that output, whose zero is traced as the origin's. None where that fails or says no more than the call."""
    params = site.eqn.params
    inner = params.get("jaxpr") or params.get("call_jaxpr") or params.get("fun_jaxpr")
    if depth_left <= 0 or inner is None:
        return None
    try:
        seen = _Inputs(site)
        with contextlib.suppress(Stop):
            Interpreter(seen).run(closed, call.leaves(), root=call.root)
        if seen.values is None:
            return None
        import jax

        from jaxdbg.nan.calls import Call

        # A literal operand (jnp.std's ddof=0) stays a constant of the retrace, as it is of the call: not followed.
        literal = [_compat.is_literal(a) for a in site.eqn.invars]
        fixed = [v for v, lit in zip(seen.values, literal) if lit]
        traced = tuple(v for v, lit in zip(seen.values, literal) if not lit)

        def divided(*values: Any) -> Any:  # the call's body inline, then 1 / its output: an origin to trace from
            given, constants = iter(values), iter(fixed)
            operands = [next(constants) if lit else next(given) for lit in literal]
            outs, _ = Interpreter(rules={}, keep_source=True).run(inner, operands, root="")
            return 1.0 / outs[output]

        retraced = divided
        mapped = next((s for s in reversed(site.enclosing()) if s.primitive == "shard_map"), None)
        if mapped is not None:  # in a shard_map body values are stacked per device: each device's body, vmapped
            layout = _compat.shard_map_layout(mapped.eqn.params)
            if layout is None:
                return None
            sizes, _, _, manual = layout
            for name in reversed(manual):
                retraced = jax.vmap(retraced, axis_name=name, axis_size=sizes[name])
        body, inside = jax.make_jaxpr(retraced)(*traced), Call(call.name, retraced, traced, {})
        jaxpr = _compat.open_jaxpr(body)[0]
        last = Site(jaxpr.eqns[-1], len(jaxpr.eqns) - 1, Scope(jaxpr, (inside.root,)))
        if last.primitive != "div":
            return None
        found = trace_zero(inside, body, last, 1, depth_left=depth_left - 1)
    except Exception:  # noqa: BLE001 - a call this cannot retrace is named as the call, as before
        return None
    return found if found is not None and found.primitive is not None else None


MASK_ELEMENTS = 1 << 22  # values larger than this keep no zero mask (the trace then follows any zero input)


def _zero_mask(value: Any) -> np.ndarray | None:
    """Where ``value`` is 0, as a host boolean array; None when it is too large or cannot be read."""
    size = getattr(value, "size", None)
    if not isinstance(size, int) or size > MASK_ELEMENTS:
        return None
    try:
        return np.asarray(value) == 0
    except Exception:  # noqa: BLE001 - a key, a token: no zeros to speak of
        return None


def _overlapping(masks: tuple[list, list] | None, operand: int, output: int) -> bool:
    """Whether the operand's zeros can be the result's: it is 0 somewhere the result is 0. Elementwise operands
    only (the same shape as the result); any other is taken as it may be (a reduction, a broadcast). ``1 - p`` that
    rounds to 0 where p is 1 is not the exp underflow that made p 0 elsewhere."""
    if masks is None or operand >= len(masks[0]) or output >= len(masks[1]):
        return True
    zero_in, zero_out = masks[0][operand], masks[1][output]
    if zero_in is None or zero_out is None or zero_in.shape != zero_out.shape:
        return True
    return bool((zero_in & zero_out).any())


def _divisor_name(origin: Site) -> str | None:
    """The identifier the origin's line divides by (``WARMUP`` in ``step / WARMUP``), where it names one."""
    source = origin.source
    if source is None or origin.primitive not in ("div", "rem"):
        return None
    found = DIVISOR.findall(linecache.getline(source.file, source.line).split("#")[0])
    return found[0] if len(found) == 1 else None  # two divisions on the line: which one is unknown


def _levels(origin: Site, var: Any) -> list[_Level]:
    """The origin's jaxpr and those enclosing it that the zero's slice reaches out to, each with its slice."""
    levels: list[_Level] = []
    site: Site | None = origin
    atoms = [var]
    while site is not None and atoms:
        jaxpr = site.scope.jaxpr
        producers = {id(v): i for i, eqn in enumerate(jaxpr.eqns[:site.index]) for v in eqn.outvars}
        needed = _slice(jaxpr, atoms, producers)
        levels.append(_Level(site, producers, frozenset(needed)))
        reached = [a for i in needed for a in jaxpr.eqns[i].invars] + atoms
        atoms = [outer for a in reached if not _compat.is_literal(a) and id(a) not in producers
                 for outer in [_maps_out(site, a)] if outer is not None]
        site = site.scope.parent
    return levels


def _maps_out(site: Site, var: Any) -> Any:
    """The operand of the enclosing equation that an input ``var`` of the site's jaxpr is bound to: a call's (or a
    shard_map's) operand, a loop's constant (not its carry), a cond branch's operand; None where there is none."""
    scope, parent = site.scope, site.scope.parent
    if parent is None or _compat.is_literal(var):
        return None
    position = next((i for i, v in enumerate(scope.jaxpr.invars) if v is var), None)
    if position is None:
        return None
    params, operands = parent.eqn.params, parent.eqn.invars
    found: int | None
    if scope.kind in ("call", "shard_map"):  # a shard_map's body gets each operand's block
        found = position
    elif scope.kind == "scan":  # in the first iteration the carry is the loop's initial value: an operand too
        n_consts, n_carry = _compat.scan_split(params)
        first = scope.iteration == (int(params["length"]) - 1 if params.get("reverse") else 0)
        found = position if position < n_consts + (n_carry if first else 0) else None
    elif scope.kind == "while_body":
        first = scope.iteration == 0
        found = params["cond_nconsts"] + position if first or position < params["body_nconsts"] else None
    elif scope.kind == "while_cond":
        found = position if position < params["cond_nconsts"] else None
    elif scope.kind == "cond":
        found = position + 1
    else:
        found = None
    return operands[found] if found is not None and found < len(operands) else None


def _captured(call: Any, consts: list | None, position: int, of: Origin | None,
              named: Mapping[int, str]) -> ZeroSource:
    """A zero held by an array the function captured (not an argument): named by the user's global that is it."""
    value = consts[position] if consts is not None and position < len(consts) else None
    index = None
    if value is not None:
        with contextlib.suppress(Exception):
            where = np.argwhere(np.asarray(value) == 0)
            index = tuple(int(i) for i in where[0]) if len(where) else None
    return ZeroSource(None, None, "captured", (value_stats(value),) if value is not None else (), (), of,
                      name=named.get(id(value)) or _global_named(call, value), index=index)


def _global_named(call: Any, value: Any) -> str | None:
    """The name of a global of the user's module (the function's, or one its code reaches) bound to ``value``."""
    if value is None:
        return None
    fun = call.fun
    for _ in range(8):  # through jax.jit's and functools' wrappers
        inner = getattr(fun, "__wrapped__", None) or getattr(fun, "__func__", None)
        if inner is None:
            break
        fun = inner
    namespace = getattr(fun, "__globals__", None) or {}
    return next((name for name, bound in list(namespace.items()) if bound is value and not name.startswith("__")),
                None)


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def _how(primitive: str, inputs: list[ValueStats | None]) -> str:
    known = [s for s in inputs if s is not None]  # None: a literal of the code (the 1 of `1 - p`)
    finite = bool(known) and all(s.finite for s in known)
    if finite and primitive in UNDERFLOWS:
        return "underflow"
    if finite and primitive in CANCELS:
        return "cancellation"
    return "made"


def _slice(jaxpr: Any, atoms: list, producers: dict[int, int]) -> set[int]:
    """The equations (indices) that compute ``atoms``."""
    needed: set[int] = set()
    stack = list(atoms)
    while stack:
        atom = stack.pop()
        index = None if _compat.is_literal(atom) else producers.get(id(atom))
        if index is not None and index not in needed:
            needed.add(index)
            stack.extend(jaxpr.eqns[index].invars)
    return needed


def _is_argument(origin: Site, var: Any) -> bool:
    """Whether ``var``, an input of the origin's jaxpr, is an argument of the call itself (passed unchanged
    through the enclosing calls)."""
    scope = origin.scope
    while scope.parent is not None:
        position = next((i for i, v in enumerate(scope.jaxpr.invars) if v is var), None)
        if scope.kind not in ("call", "shard_map") or position is None or position >= len(scope.parent.eqn.invars):
            return False
        var, scope = scope.parent.eqn.invars[position], scope.parent.scope
    return any(v is var for v in scope.jaxpr.invars)


def _arguments(origin: Site, atoms: list, names: list[str]) -> tuple[str, ...]:
    """The call's arguments (by name) that the values ``atoms`` (in the origin's jaxpr) are computed from,
    followed out through enclosing calls (a nested jit's inputs are its caller's operands); empty when a loop
    or a map stands between them and the call's arguments."""
    scope, index = origin.scope, origin.index
    while True:
        jaxpr = scope.jaxpr
        producers = {id(v): i for i, eqn in enumerate(jaxpr.eqns[:index]) for v in eqn.outvars}
        positions = {id(v): i for i, v in enumerate(jaxpr.invars)}
        reached: set[int] = set()
        stack, seen = list(atoms), set()
        while stack:
            atom = stack.pop()
            if _compat.is_literal(atom) or id(atom) in seen:
                continue
            seen.add(id(atom))
            if id(atom) in positions:
                reached.add(positions[id(atom)])
            elif id(atom) in producers:
                stack.extend(jaxpr.eqns[producers[id(atom)]].invars)
        parent = scope.parent
        if parent is None:
            return tuple(names[i] for i in sorted(reached) if i < len(names))
        if scope.kind not in ("call", "shard_map"):
            return ()
        atoms = [parent.eqn.invars[i] for i in sorted(reached) if i < len(parent.eqn.invars)]
        scope, index = parent.scope, parent.index


class _Recorder(Hooks):
    """Replays the call up to the origin, keeping the statistics of the equations in the zero's slice at each
    level (in the origin's jaxpr: the latest pass through it, the one the origin is in; in each enclosing one,
    the pass that encloses the origin), and the captured constants of each level's jaxpr."""

    def __init__(self, origin: Site, operand: int, levels: list[_Level]):
        self.origin, self.operand, self.levels = origin, operand, levels
        self.stats: dict[int, dict[int, tuple[list[ValueStats | None], list[ValueStats]]]] = {
            depth: {} for depth in range(len(levels))}
        # where each value of the slice is 0 (None: a literal, or too large to keep): a zero is followed into an
        # input only where the input is 0 at the same places as the result (see _overlapping)
        self.zeros: dict[int, dict[int, tuple[list[np.ndarray | None], list[np.ndarray | None]]]] = {
            depth: {} for depth in range(len(levels))}
        self.consts: dict[int, list] = {}
        self.reached = False

    def _level(self, site: Site) -> int | None:
        """The level whose jaxpr (at its place) the site runs in, if its equation is in that level's slice."""
        for depth, level in enumerate(self.levels):
            if site.index in level.needed and site.scope.jaxpr is level.site.scope.jaxpr \
                    and site.path == level.site.path:
                return depth
        return None

    def const_tags(self, scope: Scope, consts: list) -> list:
        for depth, level in enumerate(self.levels):
            if scope.jaxpr is level.site.scope.jaxpr and scope.path == level.site.path:
                self.consts[depth] = list(consts)
        return [None] * len(consts)

    def before(self, site: Site, invals: list, in_tags: list) -> list | None:
        if site.scope.jaxpr is self.origin.scope.jaxpr and site.path == self.origin.path \
                and site.index == self.origin.index and value_stats(invals[self.operand]).zero:
            self.reached = True
            raise Stop()
        return None

    def keeps_inputs(self, site: Site) -> bool:
        return self._level(site) is not None  # a nested jit in the slice: its inputs' statistics

    def after(self, site: Site, invals: list, outvals: list, in_tags: list, out_tags: list,
              descended: bool) -> list | None:
        depth = self._level(site)
        if depth is not None:
            # a literal (a constant written in the code) is never followed: an operation by a constant 0 made it
            self.stats[depth][site.index] = ([None if _compat.is_literal(a) else value_stats(v)
                                              for a, v in zip(site.eqn.invars, invals)],
                                             [value_stats(v) for v in outvals])
            self.zeros[depth][site.index] = ([None if _compat.is_literal(a) else _zero_mask(v)
                                              for a, v in zip(site.eqn.invars, invals)],
                                             [_zero_mask(v) for v in outvals])
        return None
