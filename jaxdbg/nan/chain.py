"""The ``chain`` analysis: for a NaN found after Infs, where the infinities it was made of were born.

A script runs on after its first Inf (see :class:`~jaxdbg.nan.watch.Watch`'s ``after_inf``), and the watch
follows which arrays hold which Infs. When the NaN's call (or eager operation) got an Inf through an argument,
the calls that made those Infs are replayed and their origins put before the replay's own chain, earliest
first. An Inf that came before and did not feed the NaN is said in a note.

Example:
    >>> from jaxdbg.nan.analyses import Findings
    >>> from jaxdbg.nan.watch import Watch
    >>> findings = Findings(first=None, watch=Watch())
    >>> analyse(findings)       # no Inf came before: nothing to add
    >>> findings.chain, findings.notes
    ([], [])
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from jaxdbg.nan.localise import localise_call, origins_of_outputs
from jaxdbg.nan.result import Origin
from jaxdbg.nan.watch import EagerFinding, JitFinding

if TYPE_CHECKING:
    from jaxdbg.nan.analyses import Findings


def analyse(findings: Findings) -> None:
    """Put the origins of the Infs that fed the NaN before ``findings.chain``; notes for the others."""
    finding, watch = findings.finding, findings.watch
    if isinstance(finding, JitFinding):
        came_in = [c.argument for c in findings.chain if c.kind == "input" and any(s.inf for s in c.outputs)]
        if came_in and finding.argument_feeds:  # only the Infs of the arguments that fed the NaN
            finding = dataclasses.replace(finding, feeds=frozenset().union(
                *(finding.argument_feeds.get(name or "", frozenset()) for name in came_in)) or finding.feeds)
        findings.came_in = findings.came_in or bool(came_in)
    earlier, sources, notes = _earlier_infs(finding, watch, findings.options, findings.came_in)
    findings.chain[:0] = earlier
    findings.notes[:0] = notes
    findings.sources.update(sources)


def _earlier_infs(finding: JitFinding | EagerFinding, watch: Any, options: Any,
                  inf_came_in: bool) -> tuple[list[Origin], dict, list[str]]:
    """For a NaN found after Infs: the origins of the Infs it was made from (each Inf's own chain first),
    their input lines, and notes (an earlier Inf that did not feed it, or that no NaN followed an Inf).

    ``inf_came_in``: the NaN's operation or call got an Inf from outside; when the watch could not follow
    which (the array went through code it does not see), the first Inf is taken.
    """
    infs = watch.inf_findings if watch is not None else []
    if not infs:
        return [], {}, []
    if finding is infs[0] or finding.kind == "inf":
        return [], {}, [(f"no NaN followed this Inf: the program went on for {watch.calls_after_inf} more "
                         "jitted call(s) and stayed free of NaN (an Inf alone is the answer then)")]
    feeds: dict[int, set] = {}
    for index, position in finding.feeds:
        feeds.setdefault(index, set()).add(position)
    if not feeds and inf_came_in:
        feeds[0] = {None}
    origins: list[Origin] = []
    sources: dict = {}
    for index in sorted(feeds):
        chain, found_sources = _localise_inf(infs[index], options.nan_only, feeds[index])
        origins += [o for o in chain if o not in origins]
        sources.update(found_sources)
    notes = []
    if 0 not in feeds:
        unrelated = _localise_inf(infs[0], options.nan_only, {None})[0][-1]
        notes.append(f"an Inf appeared before this NaN and did not feed it: {unrelated.describe()}")
    return origins, sources, notes


def _localise_inf(finding: JitFinding | EagerFinding, nan_only: bool, positions: set) -> tuple[list[Origin], dict]:
    """An Inf finding as origins, earliest first, with their input lines: those behind the outputs at
    ``positions`` when they are known (the outputs that carried the Inf on), else the call's first Inf and
    its chain."""
    if isinstance(finding, EagerFinding):
        return [finding.origin], {}
    call = finding.call
    if None not in positions:
        origins, sources = origins_of_outputs(call, sorted(positions), nan_only, finding.closed_jaxpr)
        if origins:
            return origins, sources
    found = localise_call(call, nan_only, finding.closed_jaxpr)
    if found.first is None:
        return [Origin("inf", None, "forward", call.call_site, call.name, call.call_index, (call.root,))], {}
    return [*found.chain, found.first], dict(found.input_sources or {})
