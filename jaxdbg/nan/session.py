"""``nan-hunt`` in the process that runs the target: watch, catch the first non-finite call, localise, explain.

:func:`hunt_here` runs a script as ``__main__`` under a :class:`~jaxdbg.nan.watch.Watch`, or runs a function
target once (compiled) and localises it if its outputs are non-finite. :func:`jaxdbg.nan.api.hunt` runs
this in a contained child process (the command line); call :func:`hunt_here` directly from tests or a
notebook (the target then shares this process).

Example:
    >>> from jaxdbg.target import parse_target
    >>> result, artifacts = hunt_here(parse_target("recipes/nan_forward/train.py"), HuntOptions())  # doctest: +SKIP
    >>> result.first.primitive, result.first.pass_                                              # doctest: +SKIP
    ('log', 'forward')
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten_with_path

from jaxdbg import _compat, _malloc, frameworks, multihost
from jaxdbg._errors import TargetFailedError, UsageError
from jaxdbg.jit_layer import unwrap_function
from jaxdbg.nan.analyses import Findings, guarded, run_analyses
from jaxdbg.nan.api import HuntOptions
from jaxdbg.nan.calls import Call, readable_keystr
from jaxdbg.nan.fidelity import bisect_compiled
from jaxdbg.nan.localise import localise_call
from jaxdbg.nan.messages import HuntFinished, HuntJob, JobFinding, NonFiniteDetected, PeerNote
from jaxdbg.nan.result import AnalysisWarning, GradNorm, NanHuntResult, Origin, OriginKind, ProcessFinding
from jaxdbg.nan.stats import is_inexact, nonfinite_flags
from jaxdbg.nan.watch import EagerFinding, JitFinding, NonFiniteFound, Watch
from jaxdbg.protocol import handles
from jaxdbg.runner import first_line
from jaxdbg.target import TargetSpec, check_arity, load_function, load_inputs, run_script


@handles(HuntJob)
def hunt_job(job: HuntJob, channel: Any) -> None:
    """Contained-run job: :func:`hunt_here` in the child; sends :class:`HuntFinished`."""
    from jaxdbg.report import environment_info

    presence = multihost.HeartbeatOnceJoined("nan-hunt", where_this_process_stands,
                                             lambda _, line: channel.send(PeerNote(line)),
                                             hung_s=multihost.hung_wait(job.options.timeout))
    presence.start()
    try:
        result, artifacts = hunt_here(job.spec, job.options, channel)
        warnings: list[AnalysisWarning] = []
        shared: list[NanHuntResult] = []
        guarded(warnings, "job", lambda: shared.append(share_with_the_job(result, job.options.timeout)))
        result = shared[0] if shared else dataclasses.replace(result, warnings=(*result.warnings, *warnings))
    finally:
        presence.stop()
    channel.send(HuntFinished(result, artifacts, environment_info()))


def where_this_process_stands() -> dict:
    """For the job's other processes, should this one stop answering or hang (its heartbeat's state).

    Example:
        >>> where_this_process_stands()["in_call"]
        False
    """
    from jaxdbg.jit_layer import main_thread_calls

    name, calls = main_thread_calls()
    text = f"in a call of {name} ({calls} jitted calls so far)" if name else f"after {calls} jitted calls"
    return {"text": text, "progress": calls, "in_call": name is not None}


GATHER_WAIT_S = 60.0  # how long process 0 waits for the other processes' answers
FINDINGS = multihost.Topic("nan-hunt", "finding", JobFinding)


def share_with_the_job(result: NanHuntResult, timeout: float | None) -> NanHuntResult:
    """In a multi-process job: every process publishes what it found; process 0's result then says, for each
    process, whether it found the origin, and places the origin on the process and device whose shard
    holds the first non-finite value (each process sees only its own shards)."""
    place = multihost.job()
    if place is None:
        return result
    first = result.first
    mine = JobFinding(result.found)
    if first is not None:
        mine = JobFinding(result.found, first.describe(job=True), first.process, first.device, first.shard)
    multihost.publish(FINDINGS, mine)
    if place.index != 0:
        return result
    wait = GATHER_WAIT_S if timeout is None else max(min(GATHER_WAIT_S, timeout / 2), 1.0)
    got = multihost.gather(FINDINGS, wait)
    rows = tuple(
        ProcessFinding(i, bool(got[i].found), got[i].origin, got[i].process, got[i].device) if i in got
        else ProcessFinding(i, False, note=multihost.missing_line("nan-hunt", i, place.count, wait))
        for i in range(place.count))
    holders = [got[i] for i in sorted(got) if got[i].device is not None]
    if first is not None and holders:
        held = holders[0]
        first = dataclasses.replace(first, process=held.process, device=held.device, shard=held.shard or None)
    return dataclasses.replace(result, first=first, processes=rows)


# ---------------------------------------------------------------------------------------------------------
# In this process
# ---------------------------------------------------------------------------------------------------------


def hunt_here(spec: TargetSpec, options: HuntOptions, channel: Any = None) -> tuple[NanHuntResult, dict[str, str]]:
    """Run the target in this process and return ``(result, artifacts)`` (see :func:`hunt`)."""
    if spec.is_script:
        return _hunt_script(spec, options, channel)
    return _hunt_function(spec, options, channel)


# After the first Inf the script goes on for up to this many jitted calls: the contract's origin is the first
# NaN when the program makes one, and an overflow usually turns into one (inf - inf, 0 * inf) within a few steps.
AFTER_INF_CALLS = 64


def _hunt_script(spec: TargetSpec, options: HuntOptions, channel: Any) -> tuple[NanHuntResult, dict[str, str]]:
    watch = Watch(options.nan_only, options.growth_factor, after_inf=AFTER_INF_CALLS, read_late=True, trim=True)
    failure: BaseException | None = None
    try:
        with watch:
            run_script(spec)
    except NonFiniteFound:
        pass
    except (KeyboardInterrupt, UsageError):
        raise
    except BaseException as err:  # noqa: BLE001 - whatever the script raised is reported, not propagated
        failure = err
    names = tuple(dict.fromkeys(f.name for f in watch.functions))
    if watch.finding is None:
        if failure is not None:
            from jaxdbg.runner import describe_exception

            info = describe_exception(failure)
            where = f" at {info.user_frame}" if info.user_frame else ""
            raise TargetFailedError(
                f"the script raised {info.type}: {first_line(info.message)}{where} before any NaN/Inf was seen; "
                "fix that failure first") from None
        return NanHuntResult(False, growth=tuple(watch.growth.report()), calls_watched=watch.calls,
                             functions_watched=names,
                             explanation=_clean_text(watch.calls, watch.eager_ops, names)), {}
    named: dict[int, str] = {}
    if _self_contained(watch):
        for namespace in _script_globals(watch, spec.path):
            named.update(_release_arrays(namespace))
    _return_freed_memory()
    return _analyse(watch.finding, watch, options, channel, names, named=named)


def _return_freed_memory() -> None:
    """Give the memory the ended run freed back to the system before the replay. XLA:CPU ran the program on its
    own threads, whose malloc arenas keep what they freed; the replay allocates from the main thread's, so
    without this its peak stacked on the run's (48-block MLP, 392 MiB of parameters: +700 MiB of resident
    memory for a replay holding 600 MiB more arrays). glibc only; elsewhere nothing happens."""
    _malloc.trim()


def _script_globals(watch: Watch, path: str | None) -> list[dict]:
    """The globals of the ended script, as its watched functions hold them (runpy hands back a copy)."""
    found: dict[int, dict] = {}
    for function in watch.functions:
        inner = unwrap_function(frameworks.user_function(function.fun))
        code = getattr(inner, "__code__", None)
        if code is not None and code.co_filename == path and isinstance(getattr(inner, "__globals__", None), dict):
            found[id(inner.__globals__)] = inner.__globals__
    return list(found.values())


def _self_contained(watch: Watch) -> bool:
    """Whether the analysis needs nothing of the script but what the watch kept: every call it will replay
    was traced while under way (no trace later, which would read the script's globals)."""
    findings = [watch.finding, *watch.inf_findings]
    return all(isinstance(f, EagerFinding) or (f is not None and f.closed_jaxpr is not None) for f in findings)


def _release_arrays(namespace: dict) -> dict[int, str]:
    """Drop the ended script's global names that hold jax arrays (a training loop's latest parameters and
    optimiser state, kept alive through its functions' globals): the replay that follows holds the failing
    call's own inputs and would otherwise peak with one more copy of the model. Measured on a 48-block
    residual MLP of width 1024 (392 MiB of parameters): nan-hunt's peak 1.55x the plain run's before.
    Returns the names of the dropped arrays by ``id``: an array a jitted function captured (a global noise
    schedule) lives on in its jaxpr, and the analyses name it."""
    named = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") or isinstance(value, type) or callable(value):
            continue
        try:
            holds = any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(value))
        except Exception:  # noqa: BLE001 - a value jax cannot flatten holds no array it would see
            holds = False
        if holds:
            if isinstance(value, jax.Array):
                named[id(value)] = name
            del namespace[name]
    return named


def _clean_text(calls: int, eager: int, names: tuple[str, ...]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:5]) or "none"
    return (f"No NaN or Inf appeared: {calls} jitted call(s) of {len(names)} function(s) ({shown}) and {eager} "
            "eager operation(s) were checked and all their outputs stayed finite.")


def _hunt_function(spec: TargetSpec, options: HuntOptions, channel: Any) -> tuple[NanHuntResult, dict[str, str]]:
    fn = load_function(spec)
    inputs = load_inputs(options.inputs, options.args, options.seed)
    check_arity(fn, inputs, spec.function)
    assert spec.function is not None  # load_function has found it
    name = spec.function
    target = fn
    if options.grad:
        bad = [i for i in options.argnums if not -len(inputs) <= i < len(inputs)]
        if bad:
            raise UsageError(f"--argnums {','.join(map(str, options.argnums))}: the function gets {len(inputs)} "
                             f"argument(s); pick positions 0..{len(inputs) - 1}")
        target = jax.value_and_grad(_loss_with_aux(fn), argnums=options.argnums, has_aux=True)
        name = f"grad({name})"
    static = tuple(sorted(_compat.jit_static_argnums(fn, len(inputs))))  # a jitted target's own static arguments
    try:
        out = jax.jit(target, static_argnums=static)(*inputs)
    except TypeError as err:
        if options.grad and "scalar" in str(err):
            raise UsageError(f"--grad: {spec.function} must return a scalar loss or a (scalar loss, aux) pair to be "
                             f"differentiated ({first_line(str(err))})") from None
        raise TargetFailedError(f"{spec.function} raised TypeError: {first_line(str(err))}") from err
    except Exception as err:
        raise TargetFailedError(f"{spec.function} raised {type(err).__name__}: {first_line(str(err))}") from err
    grad_norms = _grad_norms(fn, out[1], options.argnums) if options.grad else ()
    flags = [nonfinite_flags(x) for x in jax.tree_util.tree_leaves(out)]
    nonfinite = any(n or (i and not options.nan_only) for n, i in flags)
    if not nonfinite:
        return NanHuntResult(False, grad_norms=grad_norms, calls_watched=1, functions_watched=(name,),
                             explanation=f"No NaN or Inf: every output of `{name}` is finite for these inputs."), {}
    if target is fn and hasattr(fn, "lower") and hasattr(fn, "__wrapped__"):
        target = fn.__wrapped__  # replay the jitted target's own Python function: one jit(...) in the path, not two
    call = Call(name, target, tuple(inputs), {}, static_argnums=static, call_index=0)
    watch = Watch(options.nan_only, options.growth_factor)
    kind: OriginKind = "nan" if any(n for n, _ in flags) else "inf"
    return _analyse(JitFinding(call, [], kind), watch, options, channel, (name,), grad_norms)


def _loss_with_aux(fn: Any) -> Any:
    """``fn`` for ``value_and_grad(..., has_aux=True)``: a ``(scalar loss, aux)`` pair is taken as loss and aux (as
    ``has_aux=True`` would), any other output as the loss itself with no aux (a non-scalar then fails as usual).

    Example:
        >>> jax.value_and_grad(_loss_with_aux(lambda x: (x * x, {"x": x})), has_aux=True)(3.0)[1]
        Array(6., dtype=float32, weak_type=True)
    """
    import functools

    @functools.wraps(fn)
    def loss(*args: Any) -> tuple[Any, Any]:
        out = fn(*args)
        if isinstance(out, (tuple, list)) and len(out) == 2 and jax.numpy.ndim(out[0]) == 0 and is_inexact(out[0]):
            return out[0], out[1]
        return out, None

    return loss


def _grad_norms(fn: Any, grads: Any, argnums: tuple[int, ...]) -> tuple[GradNorm, ...]:
    import inspect

    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
        params = []
    norms = []  # value_and_grad with a tuple of argnums gives one gradient per position
    for argnum, tree in zip(argnums, grads):
        base = params[argnum] if argnum < len(params) else f"args[{argnum}]"
        for path, leaf in tree_flatten_with_path(tree)[0]:
            host = np.asarray(leaf, dtype=np.float64) if is_inexact(leaf) else None
            if host is None:
                continue
            finite = host[np.isfinite(host)]
            norm = float(np.sqrt(np.sum(host ** 2))) if finite.size == host.size else float("nan")
            norms.append(GradNorm(base + readable_keystr(tree, path), norm, int(np.isnan(host).sum()),
                                  int(np.isinf(host).sum())))
    return tuple(norms)


# ---------------------------------------------------------------------------------------------------------
# Analysis of a finding
# ---------------------------------------------------------------------------------------------------------


def _analyse(finding: JitFinding | EagerFinding, watch: Watch, options: HuntOptions, channel: Any,
             names: tuple[str, ...], grad_norms: tuple = (), named: dict[int, str] | None = None
             ) -> tuple[NanHuntResult, dict[str, str]]:
    """Localise a finding, then run the analyses after the origin (:mod:`jaxdbg.nan.analyses`), each guarded."""
    if isinstance(finding, EagerFinding):
        findings = Findings(finding.origin, finding, watch, options, strategy="eager check",
                            came_in=any(s.inf for s in finding.origin.inputs))
        calls = watch.calls
    else:
        call = finding.call
        if channel is not None:
            channel.send(NonFiniteDetected(call.name, call.call_index, call.call_site, finding.kind))
        findings = _localised(finding, watch, options)
        calls = max(watch.calls, 1)
    findings.globals_named = named or {}
    run_analyses(findings)
    return findings.result(calls, names, grad_norms), findings.artifacts


def _localised(finding: JitFinding, watch: Watch, options: HuntOptions) -> Findings:
    """The origin of a jitted finding: op-by-op replay, else compiled-prefix bisection, else the call itself
    (also when the localisation fails: a warning then says why)."""
    call = finding.call
    findings = Findings(None, finding, watch, options, call)

    def localise() -> None:
        found = localise_call(call, options.nan_only, finding.closed_jaxpr, infs_only=finding.kind == "inf")
        findings.localisation, findings.strategy, findings.first = found, found.strategy, found.first
        findings.chain, findings.sources = list(found.chain), dict(found.input_sources or {})
        findings.notes += found.notes
        if found.first is None:
            bisected = bisect_compiled(found.closed_jaxpr, call.leaves(), call.name, call.call_index, options.nan_only,
                                       call.root)
            if bisected is not None:
                findings.first, findings.strategy = bisected.origin, "compiled-prefix bisection"
                findings.notes.append(f"op-by-op replay stayed finite; {bisected.probes} compiled prefixes of "
                                      f"{bisected.equations} equations bisected")
            else:
                findings.notes.append("neither op-by-op replay nor compiled prefixes reproduced the non-finite "
                                      "outputs (nondeterministic, or dependent on state outside the call's arguments)")

    if not guarded(findings.warnings, "localise", localise):
        findings.strategy = None
    if findings.first is None:
        findings.first = Origin(finding.kind, None, "forward", call.call_site, call.name, call.call_index,
                                (call.root,))
    return findings


def analyse_finding(finding: JitFinding | EagerFinding, watch: Watch, options: HuntOptions,
                    names: tuple[str, ...]) -> tuple[NanHuntResult, dict[str, str]]:
    """nan-hunt's analysis of a finding of ``watch`` (localise, chain, growth, explanation, bundle under
    ``options.out_dir``): what ``jaxdbg.watch`` runs in the user's process."""
    return _analyse(finding, watch, options, None, names)
