"""An equation-by-equation jaxpr interpreter with hooks, shared by jaxdbg's analyses.

It evaluates a (closed) jaxpr one equation at a time on concrete values (or on tracers, to retrace), and
descends into higher-order primitives through a rule table keyed by primitive name:

=====================================  ==============================================================
primitive                              what the rule does (the path element it adds)
=====================================  ==============================================================
``jit``/``pjit``                       interprets the inner jaxpr (``jit(name)``)
``closed_call``/``core_call``          interprets the called jaxpr (``call``; ``eval_jaxpr`` too, as jax 0.11
                                       writes ``custom_root``'s gradient)
``custom_jvp_call``                    interprets the primal jaxpr (``custom_jvp(name)``)
``custom_vjp_call``                    interprets the primal jaxpr (``custom_vjp(name)``); the user's
                                       backward rule, once differentiated, is ordinary equations
``remat2``/``checkpoint``              interprets the rematerialised jaxpr (``checkpoint``)
``scan``                               one pass of the body per element (``scan[iteration=i]``)
``while``                              cond then body per iteration (``while[iteration=k]``)
``cond``                               the branch the index selects (``cond[branch=b]``)
``shard_map``                          the body per device, all devices in lockstep (``shard_map``)
``pallas_call``                        the kernel's refs discharged to values, its own lines op by op
                                       (``pallas(kernel)``); over a grid, program by program on its
                                       blocks (``pallas(kernel)[program=i]``, :mod:`jaxdbg.jaxpr.pallas`)
=====================================  ==============================================================

Every other primitive is *bound* (run as one operation). A higher-order primitive without a rule is also
bound, and reported to :meth:`Hooks.opaque` first: nothing is skipped silently.

Values are freed as they die, as in jax's own ``eval_jaxpr``: a variable that is not an output of its jaxpr
leaves the environment as the last equation that reads it starts (in every jaxpr the rules descend into),
so replaying a training step holds what the step holds, not every activation at once. That holds across
calls too: the inputs of an equation a rule descends into (a nested jit, a checkpoint, a cond branch) are
handed over to the inner jaxpr, which frees each after its own last use; a backward pass in a jit of its own
drops each residual of the forward pass once it is used, not when the whole backward pass is done. A hook
that wants a value later keeps its own reference (e.g. the ``invals`` it is given); ``after`` sees the inputs
of such an equation only where :meth:`Hooks.keeps_inputs` asks for them. Where malloc is glibc's, the memory
freed that way is given back to the system after every :data:`TRIM_AFTER_BYTES` of values made
(:class:`jaxdbg._malloc.TrimAfter`): the heap otherwise kept it, and a replay peaked well above what it held.

Each value may carry a *tag* (any object a hook chooses, e.g. where a NaN came from). Tags flow with the
values into inner jaxprs and back out; :meth:`Hooks.after` sets the tags of an equation's outputs.

Example:
    >>> import jax, jax.numpy as jnp
    >>> class Paths(Hooks):
    ...     def __init__(self): self.seen = []
    ...     def after(self, site, invals, outvals, in_tags, out_tags, descended):
    ...         self.seen.append((site.path, site.primitive))
    >>> def f(xs):
    ...     return jax.lax.scan(lambda c, x: (c + jnp.log(x), None), 0.0, xs)[0]
    >>> hooks = Paths()
    >>> outs = interpret(jax.make_jaxpr(f)(jnp.ones(2)), [jnp.ones(2)], hooks=hooks, root="jit(f)")
    >>> hooks.seen[:2]
    [(('jit(f)', 'scan[iteration=0]'), 'log'), (('jit(f)', 'scan[iteration=0]'), 'convert_element_type')]
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdbg import _compat, _malloc
from jaxdbg._source import SourceLocation
from jaxdbg.jaxpr import pallas

# The values an interpreter makes between two trims of glibc's free memory (see the module docstring). Replaying a
# 48-block MLP's step (10 s, 48 trims), the trims took 0.4-0.7 s in all (8-15 ms each, the longest 180 ms); a
# small program's replay, which makes less than this, never trims.
TRIM_AFTER_BYTES = 64 * 2**20


class Stop(Exception):
    """Raised by a hook to end the interpretation early; :func:`interpret` lets it reach the caller."""


@dataclass(frozen=True, eq=False)
class Scope:
    """One jaxpr being interpreted: where it sits (``path``) and the equation that opened it.

    ``kind`` is ``root``, ``call``, ``scan``, ``while_cond``, ``while_body``, ``cond`` or ``shard_map``;
    ``iteration`` is the loop iteration (scan element index) or the cond branch, else None.
    """

    jaxpr: Any
    path: tuple[str, ...]
    parent: Site | None = None
    kind: str = "root"
    iteration: int | None = None


@dataclass(frozen=True, eq=False)
class Site:
    """One equation at one place of the run (the same equation in two loop iterations: two sites)."""

    eqn: Any
    index: int
    scope: Scope

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    @property
    def path(self) -> tuple[str, ...]:
        return self.scope.path

    @property
    def name_stack(self) -> str:
        return _compat.eqn_name_stack(self.eqn)

    @property
    def source(self) -> SourceLocation | None:
        """The user line that created the equation, else that of the nearest enclosing equation that has one."""
        site: Site | None = self
        while site is not None:
            found = _compat.eqn_source(site.eqn)
            if found is not None:
                return found
            site = site.scope.parent
        return None

    def enclosing(self) -> list[Site]:
        """The equations this one sits inside, outermost first."""
        chain, site = [], self.scope.parent
        while site is not None:
            chain.append(site)
            site = site.scope.parent
        return chain[::-1]


class Hooks:
    """What an analysis plugs into :class:`Interpreter`. Override any subset; the defaults do nothing.

    Order per equation: :meth:`before` (may supply the outputs), then the rule or a plain bind, then
    :meth:`after`. For an equation a rule descended into, the inner equations' hooks run in between and
    ``after`` gets ``descended=True``.
    """

    def before(self, site: Site, invals: list, in_tags: list) -> list | None:
        """Return outputs to use instead of evaluating the equation (then no rule runs), or None."""
        return None

    def after(self, site: Site, invals: list, outvals: list, in_tags: list, out_tags: list,
              descended: bool) -> list | None:
        """Seen every equation's outputs; return new tags for them, or None to keep ``out_tags``.

        For an equation a rule descended into, ``invals`` is empty unless :meth:`keeps_inputs` kept them.
        """
        return None

    def keeps_inputs(self, site: Site) -> bool:
        """Whether :meth:`after` needs the inputs of this higher-order equation. By default (False) they go to
        the inner jaxpr alone, which frees each after its last use inside; True holds them all until the
        equation is done (the inputs of a backward pass in a jit of its own: every residual at once)."""
        return False

    def opaque(self, site: Site, reason: str) -> None:
        """A higher-order equation is being run as one operation (no rule, or its rule gave up)."""

    def const_tags(self, scope: Scope, consts: list) -> list:
        """Tags of a jaxpr's captured constants when the interpreter enters it."""
        return [None] * len(consts)

    def literal_tag(self, literal: Any) -> Any:
        """Tag of a literal written in an equation (e.g. ``-inf`` in ``select_n m x -inf``)."""
        return None

    def merge_tags(self, tags: Sequence[Any]) -> Any:
        """One tag for values stacked across loop iterations (scan outputs): the first that is set."""
        return next((t for t in tags if t is not None), None)


# A rule: (interpreter, site, input values, input tags) -> (output values, output tags), or None to run the
# equation whole after all (then ``invals`` must be as given). A rule owns ``invals``: once it descends, it
# empties the list (handing the values to the inner jaxpr), so that nothing holds them past their last use.
Rule = Callable[["Interpreter", Site, list, list], "tuple[list, list] | None"]


@dataclass
class Interpreter:
    """Evaluates jaxprs equation by equation. See the module docstring for the rules and the hooks.

    Args:
        hooks: the analysis (default: none).
        rules: primitive name -> rule; defaults to :data:`RULES`. Pass ``{}`` to run everything whole.
        keep_source: re-bind each equation under its own traceback/name stack (use when retracing, so the
            new jaxpr keeps the user's lines).
        binder: how a leaf equation is evaluated; default :func:`jaxdbg._compat.bind_eqn`.
        trimmer: gives glibc's free memory back as values are made; None: never.
    """

    hooks: Hooks = field(default_factory=Hooks)
    rules: dict[str, Rule] | None = None
    keep_source: bool = False
    binder: Callable[[Any, list], list] | None = None
    trimmer: _malloc.TrimAfter | None = field(default_factory=lambda: _malloc.TrimAfter(TRIM_AFTER_BYTES))

    def __post_init__(self) -> None:
        if self.rules is None:
            self.rules = RULES

    # -- entry points ------------------------------------------------------------------------------------

    def run(self, closed: Any, args: Sequence[Any], *, root: str = "jit(f)",
            tags: Sequence[Any] | None = None) -> tuple[list, list]:
        """Interpret a closed jaxpr on ``args`` (flat, in invar order); returns ``(outputs, output tags)``."""
        jaxpr, consts = _compat.open_jaxpr(closed)
        scope = Scope(jaxpr, (root,) if root else ())
        return self.eval_jaxpr(scope, consts, list(args), list(tags) if tags is not None else None)

    def eval_jaxpr(self, scope: Scope, consts: Sequence[Any], args: list,
                   tags: list | None = None) -> tuple[list, list]:
        """Interpret ``scope.jaxpr`` with its constants and arguments; returns ``(outputs, output tags)``.

        ``args`` is emptied: each argument then lives as long as the jaxpr reads it (and the caller holds it).
        """
        jaxpr = scope.jaxpr
        env: dict[Any, tuple[Any, Any]] = {}
        invars = list(jaxpr.invars)
        constvars = list(jaxpr.constvars)
        if len(args) != len(invars) or len(consts) != len(constvars):
            raise ValueError(
                f"jaxpr at {'/'.join(scope.path) or 'top'} takes {len(constvars)} constants and {len(invars)} "
                f"arguments; got {len(consts)} and {len(args)}"
            )
        for var, value, tag in zip(constvars, consts, self.hooks.const_tags(scope, list(consts))):
            env[var] = (value, tag)
        for var, value, tag in zip(invars, args, tags if tags is not None else [None] * len(args)):
            env[var] = (value, tag)
        args.clear()

        def read(atom: Any) -> tuple[Any, Any]:
            if _compat.is_literal(atom):
                return atom.val, self.hooks.literal_tag(atom)
            return env[atom]

        def step(site: Site, dying: list) -> None:  # a function: its locals (inputs, outputs) die when it returns
            invals, in_tags = [], []
            for atom in site.eqn.invars:
                value, tag = read(atom)
                invals.append(value)
                in_tags.append(tag)
                del value
            for var in dying:  # read for the last time: from now on the equation holds them (and may let go)
                env.pop(var, None)
            outs, out_tags = self.eval_eqn(site, invals, in_tags)
            for var, value, tag in zip(site.eqn.outvars, outs, out_tags):
                if not _compat.is_drop_var(var):
                    env[var] = (value, tag)
            for var in dying:  # outputs nothing reads
                env.pop(var, None)

        dead = _dead_after(jaxpr)
        for var in dead[-1]:
            del env[var]
        for index, eqn in enumerate(jaxpr.eqns):
            step(Site(eqn, index, scope), dead[index])
        results = [read(a) for a in jaxpr.outvars]
        return [v for v, _ in results], [t for _, t in results]

    def eval_eqn(self, site: Site, invals: list, in_tags: list) -> tuple[list, list]:
        """Evaluate one equation: hooks, then its rule (descend) or a plain bind."""
        n_out = len(site.eqn.outvars)
        supplied = self.hooks.before(site, invals, in_tags)
        descended = False
        if supplied is not None:
            outs, out_tags = list(supplied), [None] * n_out
        else:
            assert self.rules is not None  # set in __post_init__
            rule = self.rules.get(site.primitive)
            result = None
            if rule is not None:  # the rule owns what it is given (and empties it as it descends)
                given = list(invals) if self.hooks.keeps_inputs(site) else invals
                result = rule(self, site, given, list(in_tags))
                del given
            if result is not None:
                outs, out_tags = result
                descended = True
            else:
                if rule is None and _compat.has_inner_jaxprs(site.eqn):
                    self.hooks.opaque(site, f"no rule looks inside '{site.primitive}'; it ran as one operation")
                outs, out_tags = self.bind(site, invals), [None] * n_out
        if not descended and self.trimmer is not None:
            self.trimmer.made(_array_bytes(outs))
        new_tags = self.hooks.after(site, invals, outs, in_tags, out_tags, descended)
        return outs, list(new_tags) if new_tags is not None else out_tags

    def bind(self, site: Site, invals: list) -> list:
        """Run one equation as a single operation."""
        if self.binder is not None:
            return self.binder(site.eqn, invals)
        return _compat.bind_eqn(site.eqn, invals, keep_source=self.keep_source)

    def child(self, **changes: Any) -> Interpreter:
        """A copy with some fields changed (same hooks), e.g. another binder inside shard_map."""
        fields: dict[str, Any] = {"hooks": self.hooks, "rules": self.rules, "keep_source": self.keep_source,
                                  "binder": self.binder, "trimmer": self.trimmer}
        fields.update(changes)
        return Interpreter(**fields)


def interpret(closed: Any, args: Sequence[Any], *, hooks: Hooks | None = None, root: str = "jit(f)",
              tags: Sequence[Any] | None = None, rules: dict[str, Rule] | None = None,
              keep_source: bool = False) -> list:
    """Interpret a closed jaxpr on flat ``args`` and return its outputs (see :class:`Interpreter`)."""
    interp = Interpreter(hooks or Hooks(), rules, keep_source)
    return interp.run(closed, args, root=root, tags=tags)[0]


def _array_bytes(values: Sequence[Any]) -> int:
    """Bytes of the concrete arrays among ``values`` (a tracer holds none)."""
    return sum(v.nbytes for v in values
               if isinstance(v, (jax.Array, np.ndarray)) and not isinstance(v, jax.core.Tracer))


_DEAD_AFTER: weakref.WeakKeyDictionary[Any, dict[int, list]] = weakref.WeakKeyDictionary()


def _dead_after(jaxpr: Any) -> dict[int, list]:
    """Equation index -> the variables no later equation reads (``-1``: inputs nothing reads at all).

    The jaxpr's own outputs never die. Computed once per jaxpr (a scan body runs once per element) and
    forgotten with the jaxpr.
    """
    dead = _DEAD_AFTER.get(jaxpr)
    if dead is None:
        last = dict.fromkeys([*jaxpr.constvars, *jaxpr.invars], -1)
        for index, eqn in enumerate(jaxpr.eqns):
            last.update((a, index) for a in eqn.invars if not _compat.is_literal(a))
            last.update((v, index) for v in eqn.outvars if not _compat.is_drop_var(v) and v not in last)
        for atom in jaxpr.outvars:
            if not _compat.is_literal(atom):
                last.pop(atom, None)
        dead = {index: [] for index in range(-1, len(jaxpr.eqns))}
        for var, index in last.items():
            dead[index].append(var)
        _DEAD_AFTER[jaxpr] = dead
    return dead


# ---------------------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------------------


def _inner(interp: Interpreter, site: Site, closed: Any, label: str | None, kind: str, args: list,
           tags: list, iteration: int | None = None) -> tuple[list, list]:
    jaxpr, consts = _compat.open_jaxpr(closed)
    path = site.path + ((label,) if label else ())
    return interp.eval_jaxpr(Scope(jaxpr, path, site, kind, iteration), consts, args, tags)


def _call_rule(param: str, prefix: str, named: bool = True) -> Rule:
    """A rule for primitives that just call a jaxpr with all their operands; path element ``prefix(name)``."""

    def rule(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list]:
        params = site.eqn.params
        closed = params.get(param) or params.get("fun_jaxpr")
        name = (params.get("name") or _compat.jaxpr_function_name(closed)) if named else None
        label = f"{prefix}({getattr(name, '__name__', name)})" if name else prefix
        return _inner(interp, site, closed, label, "call", invals, in_tags)

    return rule


def _scan_rule(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list] | None:
    params = site.eqn.params
    n_consts, n_carry = _compat.scan_split(params)
    length, reverse = int(params["length"]), bool(params.get("reverse", False))
    if length == 0:
        return None  # nothing to look at: run it whole
    consts, carry, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]
    invals.clear()  # the initial carry dies with the first iteration that replaces it
    c_tags, carry_tags = in_tags[:n_consts], in_tags[n_consts:n_consts + n_carry]
    xs_tags = in_tags[n_consts + n_carry:]
    ys: list[list] = [[] for _ in range(len(site.eqn.outvars) - n_carry)]
    ys_tags: list[list] = [[] for _ in ys]
    order = range(length - 1, -1, -1) if reverse else range(length)
    for i in order:
        x_i = [x[i] for x in xs]
        label = f"scan[iteration={i}]"
        outs, tags = _inner(interp, site, params["jaxpr"], label, "scan", [*consts, *carry, *x_i],
                            [*c_tags, *carry_tags, *xs_tags], iteration=i)
        carry, carry_tags = outs[:n_carry], tags[:n_carry]
        for slot, value, tag in zip(range(len(ys)), outs[n_carry:], tags[n_carry:]):
            ys[slot].append(value)
            ys_tags[slot].append(tag)
    if reverse:
        ys = [column[::-1] for column in ys]
        ys_tags = [column[::-1] for column in ys_tags]
    stacked = []
    for slot in range(len(ys)):
        stacked.append(jnp.stack([jnp.asarray(v) for v in ys[slot]]))
        ys[slot].clear()  # free this output's per-iteration pieces before stacking the next one
    return [*carry, *stacked], [*carry_tags, *(interp.hooks.merge_tags(t) for t in ys_tags)]


MAX_WHILE_ITERATIONS = 1_000_000


def _while_rule(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list] | None:
    params = site.eqn.params
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    # ``invals`` stays whole (the initial carry too): past MAX_WHILE_ITERATIONS the loop runs whole from the start
    cond_consts, body_consts, carry = invals[:nc], invals[nc:nc + nb], invals[nc + nb:]
    cc_tags, bc_tags, carry_tags = in_tags[:nc], in_tags[nc:nc + nb], in_tags[nc + nb:]
    for k in range(MAX_WHILE_ITERATIONS):
        (pred,), _ = _inner(interp, site, params["cond_jaxpr"], f"while[cond, iteration={k}]", "while_cond",
                            [*cond_consts, *carry], [*cc_tags, *carry_tags], iteration=k)
        if not bool(np.asarray(pred).any()):
            return carry, carry_tags
        carry, carry_tags = _inner(interp, site, params["body_jaxpr"], f"while[iteration={k}]", "while_body",
                                   [*body_consts, *carry], [*bc_tags, *carry_tags], iteration=k)
    interp.hooks.opaque(site, f"the loop ran past {MAX_WHILE_ITERATIONS} iterations op by op; ran it as one operation")
    return None


def _cond_rule(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list]:
    branches = site.eqn.params["branches"]
    index = int(np.clip(np.asarray(invals[0]).reshape(-1)[0], 0, len(branches) - 1))
    operands = invals[1:]
    invals.clear()
    return _inner(interp, site, branches[index], f"cond[branch={index}]", "cond", operands,
                  list(in_tags[1:]), iteration=index)


def _shard_map_rule(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list] | None:
    """Run the body for every device in lockstep: values are stacked per device, each equation vmapped.

    jax's ``vmap`` with an ``axis_name`` gives collectives (psum, all_gather, axis_index, ...) their
    meaning, so each body equation is evaluated as ``vmap(bind)`` over the stacked devices. Nested
    higher-order equations inside the body run as one (vmapped) operation.
    """
    layout = _compat.shard_map_layout(site.eqn.params)
    if layout is None:
        interp.hooks.opaque(site, "shard_map parameters not understood on this jax version; ran it as one operation")
        return None
    sizes, in_specs, out_specs, manual = layout
    try:
        stacked = [_to_device_blocks(x, spec, sizes, manual) for x, spec in zip(invals, in_specs)]
    except Exception as err:  # noqa: BLE001 - an unusual layout falls back to running the map whole
        interp.hooks.opaque(site, f"cannot split shard_map inputs per device ({err}); ran it as one operation")
        return None
    invals.clear()
    binder = _vmapped_binder(sizes, manual)
    # Calls inside the body (a jnp function that is itself jitted, custom_jvp, remat) are descended into: bound
    # whole, their jaxprs' types name the manual axes, which only a shard_map trace accepts. Loops stay whole.
    lead = tuple(sizes[name] for name in manual)
    inner = interp.child(binder=binder, rules={k: _per_device_call(rule, lead) for k, rule in
                                               (interp.rules or RULES).items() if k in SHARD_MAP_DESCENDS})
    outs, tags = _inner(inner, site, site.eqn.params["jaxpr"], "shard_map", "shard_map", stacked, list(in_tags))
    return [_from_device_blocks(y, spec, sizes, manual) for y, spec in zip(outs, out_specs)], tags


def _per_device_call(rule: Rule, lead: tuple[int, ...]) -> Rule:
    """``rule`` for a call inside a shard_map body, where every value is stacked per device: a literal operand
    (``jax.random.normal``'s jitted ``_uniform`` called with the constants -1 and 1) becomes a variable of the
    inner jaxpr, whose equations would take it for a stacked one; so is a literal the inner jaxpr returns."""

    def stacked(x: Any, ndim: int) -> Any:
        return x if jnp.ndim(x) > ndim else jnp.broadcast_to(x, lead + jnp.shape(x))

    def per_device(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list] | None:
        given = [stacked(x, jnp.ndim(x)) if _compat.is_literal(a) else x for a, x in zip(site.eqn.invars, invals)]
        result = rule(interp, site, given, in_tags)
        if result is None:
            return None  # ``invals`` as given: the binder stacks its literals itself
        invals.clear()
        outs, tags = result
        return [stacked(y, len(v.aval.shape)) for y, v in zip(outs, site.eqn.outvars)], tags

    return per_device


def _pallas_rule(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list] | None:
    """A Pallas kernel that sees its arrays whole (no grid) runs op by op: its refs, discharged, are values;
    the outputs start as zeros (what they hold before the kernel writes them is undefined anyway)."""
    try:
        kernel = _compat.pallas_whole_kernel(site.eqn.params)
    except Exception:  # noqa: BLE001 - a kernel this jax cannot discharge runs whole, as before
        kernel = None
    name = site.eqn.params.get("name") or _compat.jaxpr_function_name(site.eqn.params["jaxpr"]) or "kernel"
    if kernel is None:
        grid = _pallas_grid(site)
        if grid is not None:
            return _pallas_programs(interp, site, invals, in_tags, grid, name)
        interp.hooks.opaque(site, "a Pallas kernel with element-indexed or bounded block dimensions, block "
                                  "transforms, or a vmapped or dynamic grid ran as one operation (its lines are "
                                  "replayed only for blocked operands)")
        return None
    outputs = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in site.eqn.outvars]
    given = list(invals)
    n_in, refs = len(invals), [*invals, *outputs]
    invals.clear()
    del outputs
    tags = [*in_tags, *([None] * (len(refs) - n_in))]
    values, tags = _inner(interp, site, kernel, f"pallas({name})", "call", refs, tags)
    if _reads_uninitialised(interp, site, given, values[n_in:]):
        invals[:] = given
        return None
    return values[n_in:], tags[n_in:]


def _reads_uninitialised(interp: Interpreter, site: Site, given: list, outs: list,
                         grid: _compat.PallasGrid | None = None) -> bool:
    """Whether a kernel whose replay made finite outputs makes non-finite ones in interpret mode, which fills
    what is not yet written with NaN (:mod:`jaxdbg.jaxpr.pallas`): then it runs whole, and a note says why."""
    if not all(bool(jnp.all(jnp.isfinite(o))) for o in outs if jnp.issubdtype(o.dtype, jnp.inexact)):
        return False
    try:
        grid = grid or _pallas_grid(site)
        if grid is None or not pallas.reads_uninitialised(grid, given, site.eqn.outvars):
            return False
    except Exception:  # noqa: BLE001 - the check is a refinement: the replay's answer stands without it
        return False
    interp.hooks.opaque(site, "a Pallas kernel that reads memory interpret mode fills with NaN (the padding of a "
                              "block past its array's edge, an output or scratch buffer before it is written) ran "
                              "as one operation: mask those reads (e.g. `jnp.where(row < n, x, 0.0)` with `row` "
                              "from `pl.program_id` and `jax.lax.broadcasted_iota`), and write every output block")
    return True


# A kernel's grid and compiled programs, per kernel jaxpr: a kernel called in a loop body is discharged and compiled
# once, not per iteration.
_PALLAS_GRIDS: weakref.WeakKeyDictionary[Any, _compat.PallasGrid | None] = weakref.WeakKeyDictionary()


def _pallas_grid(site: Site) -> _compat.PallasGrid | None:
    kernel = site.eqn.params["jaxpr"]
    if kernel not in _PALLAS_GRIDS:
        try:
            _PALLAS_GRIDS[kernel] = _compat.pallas_grid_kernel(site.eqn.params)
        except Exception:  # noqa: BLE001 - a kernel this jax cannot discharge runs whole, as before
            _PALLAS_GRIDS[kernel] = None
    return _PALLAS_GRIDS[kernel]


MAX_PALLAS_PROGRAMS = 1024  # every program of a grid up to this size is replayed op by op; of a larger one, one
_PROGRAMS: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (program ids, grid) of the kernels being replayed


def _pallas_programs(interp: Interpreter, site: Site, invals: list, in_tags: list, grid: _compat.PallasGrid,
                     name: str) -> tuple[list, list] | None:
    """A gridded Pallas kernel, program by program in grid order, as interpret mode runs it
    (:mod:`jaxdbg.jaxpr.pallas`): each program's blocks are sliced from the arrays, the kernel's own lines run op
    by op on them (``pallas(kernel)[program=i]``), and its blocks are written back before the next program runs.
    Over more than :data:`MAX_PALLAS_PROGRAMS` programs, only the first whose blocks turn non-finite is replayed
    op by op; the others run compiled. A kernel whose outputs hold a NaN or Inf only because it reads memory
    interpret mode fills with NaN runs whole, and a note says so."""
    given, outvars = list(invals), site.eqn.outvars
    state = pallas.initial(grid, invals, outvars)
    invals.clear()
    aliased = dict(grid.aliases)
    tags = [*in_tags, *(in_tags[aliased[k]] if k in aliased else None for k in range(len(outvars)))]
    tags = [*tags, *([None] * grid.scratch)]
    count, replayed = pallas.programs(grid), range(pallas.programs(grid))
    compiled = pallas.compiled(grid) if count > MAX_PALLAS_PROGRAMS else None
    if compiled is not None:
        after, ran = compiled.run(state, 0, count)
        if ran < count:  # program ran-1 is the first whose blocks turned non-finite: replay it
            state, _ = compiled.run(state, 0, ran - 1, watch=False)
            replayed = range(ran - 1, ran)
        else:
            state, replayed = after, range(0)
    for index in replayed:
        ids = pallas.program_ids(index, grid.grid)
        starts, refs = pallas.blocks(grid, state, [jnp.int32(i) for i in ids])
        label = f"pallas({name})" + (f"[program={ids[0] if len(ids) == 1 else ids}]" if ids else "")
        _PROGRAMS.append((ids, grid.grid))
        try:
            values, out_tags = _inner(interp, site, grid.kernel, label, "call", refs, list(tags))
        finally:
            _PROGRAMS.pop()
        state = pallas.write_back(grid, state, starts, values)
        tags = [*tags[:grid.scalars], *(interp.hooks.merge_tags([t, o]) for t, o in
                                         zip(tags[grid.scalars:], out_tags[grid.scalars:]))]
    if compiled is not None and replayed and replayed.stop < count:  # the programs after the one replayed
        state, _ = compiled.run(state, replayed.stop, count, watch=False)
        tags = [*tags[:grid.scalars], *([interp.hooks.merge_tags(tags)] * (len(tags) - grid.scalars))]
    outs = pallas.outputs(grid, state, outvars)
    if _reads_uninitialised(interp, site, given, outs, grid):
        invals[:] = given
        return None
    first_out = len(tags) - grid.scratch - len(outvars)
    return outs, tags[first_out:first_out + len(outvars)]


def _program_rule(interp: Interpreter, site: Site, invals: list, in_tags: list) -> tuple[list, list] | None:
    """``pl.program_id(axis)`` / ``pl.num_programs(axis)`` inside a kernel replayed program by program."""
    if not _PROGRAMS:
        return None
    ids, grid = _PROGRAMS[-1]
    axis = int(site.eqn.params["axis"])
    return [jnp.int32(ids[axis] if site.primitive == "program_id" else grid[axis])], [None]


def _spec_axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _to_device_blocks(x: Any, spec: Any, sizes: dict[str, int], manual: tuple[str, ...]) -> Any:
    """Global array -> ``[*manual axis sizes, *block]``: device (i, j, ...) holds its own block. An array this
    process holds whole is gathered first: a sharding on the mesh's explicit axes (the default of
    ``jax.make_mesh``) would follow the blocks into the vmapped body, where jax refuses it."""
    if isinstance(x, jax.Array) and x.is_fully_addressable and len(x.sharding.device_set) > 1:
        x = jax.device_get(x)  # (a device_put keeps the sharding in the type)
    x = jnp.asarray(x)
    entries = list(spec) + [None] * (x.ndim - len(tuple(spec)))
    shape, split_axes = [], []
    for dim, entry in enumerate(entries):
        names = [a for a in _spec_axes(entry) if a in manual]
        block = x.shape[dim]
        for name in names:
            block //= sizes[name]
        shape += [sizes[n] for n in names] + [block]
        split_axes += [*names, None]
    x = x.reshape(shape)
    positions = {name: i for i, name in enumerate(split_axes) if name is not None}
    block_dims = [i for i, name in enumerate(split_axes) if name is None]
    for name in manual:  # replicated along a mesh axis the spec does not name: every device has it all
        if name not in positions:
            x = jnp.expand_dims(x, 0)
            x = jnp.broadcast_to(x, (sizes[name], *x.shape[1:]))
            positions = {k: v + 1 for k, v in positions.items()}
            block_dims = [d + 1 for d in block_dims]
            positions[name] = 0
    return jnp.transpose(x, [positions[n] for n in manual] + block_dims)


def _from_device_blocks(y: Any, spec: Any, sizes: dict[str, int], manual: tuple[str, ...]) -> Any:
    """Inverse of :func:`_to_device_blocks`; axes the out spec does not name are replicated: take device 0."""
    y = jnp.asarray(y)
    k = len(manual)
    block_ndim = y.ndim - k
    entries = list(spec) + [None] * (block_ndim - len(tuple(spec)))
    named = {n for e in entries for n in _spec_axes(e) if n in manual}
    index = tuple(slice(None) if n in named else 0 for n in manual)
    y = y[index]
    kept = [n for n in manual if n in named]
    order, shape = [], []
    for dim, entry in enumerate(entries):
        names = [a for a in _spec_axes(entry) if a in manual]
        order += [kept.index(n) for n in names] + [len(kept) + dim]
        shape.append(int(np.prod([sizes[n] for n in names], dtype=int)) * y.shape[len(kept) + dim])
    return jnp.transpose(y, order).reshape(shape)


# Collectives that only change a value's type (which manual axes it varies over), never its data: a
# shard_map body that mixes replicated and per-device values holds ``pvary`` (check_vma), and so does its
# gradient.
# Bound under vmap outside a mesh they raise ("pvary should be called under jax.shard_map"); per-device
# stacked values already vary, so they pass through (a literal is stacked, as every other value is).
_TYPE_ONLY = frozenset({"pvary"})


def _vmapped_binder(sizes: dict[str, int], manual: tuple[str, ...]) -> Callable[[Any, list], list]:
    def bind(eqn: Any, invals: list) -> list:
        if eqn.primitive.name in _TYPE_ONLY:  # a literal (the same on every device) is stacked like the rest
            lead = tuple(sizes[name] for name in manual)
            return [jnp.broadcast_to(x, lead + jnp.shape(x)) if _compat.is_literal(a) else x
                    for a, x in zip(eqn.invars, invals)]
        batched = [0 if not _compat.is_literal(a) else None for a in eqn.invars]

        def one(*xs: Any) -> list:
            return _compat.bind_eqn(eqn, list(xs))

        fn = one
        for name in reversed(manual):
            fn = jax.vmap(fn, in_axes=batched, axis_name=name, axis_size=sizes[name])
        return list(fn(*invals))

    return bind


SHARD_MAP_DESCENDS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                      "custom_vjp_call_jaxpr", "remat2", "checkpoint")  # whose rules work per device, vmapped

RULES: dict[str, Rule] = {
    "jit": _call_rule("jaxpr", "jit"),
    "pjit": _call_rule("jaxpr", "jit"),
    "closed_call": _call_rule("call_jaxpr", "call", named=False),
    "core_call": _call_rule("call_jaxpr", "call", named=False),
    "eval_jaxpr": _call_rule("call_jaxpr", "call", named=False),  # jax 0.11: custom_root's gradient calls it
    "custom_jvp_call": _call_rule("call_jaxpr", "custom_jvp"),
    "custom_vjp_call": _call_rule("call_jaxpr", "custom_vjp"),
    "custom_vjp_call_jaxpr": _call_rule("fun_jaxpr", "custom_vjp"),
    "remat2": _call_rule("jaxpr", "checkpoint", named=False),
    "checkpoint": _call_rule("jaxpr", "checkpoint", named=False),
    "scan": _scan_rule,
    "while": _while_rule,
    "cond": _cond_rule,
    "shard_map": _shard_map_rule,
    "pallas_call": _pallas_rule,
    "program_id": _program_rule,
    "num_programs": _program_rule,
}
"""The default rule table: primitive name -> rule. Copy and extend it to change what is descended into."""
