"""The last calls of every process on one time line: a Perfetto (Chrome trace event) file, and a picture.

Each process is a track group, its threads tracks; a jitted call is a slice from its start to the moment
its results were ready (a call that never returned, or whose results never became ready, runs to the
snapshot and says so); host callbacks are slices on the thread that ran them; the user line each process
stood at when the snapshot was taken is an instant event. Open ``timeline.json`` at https://ui.perfetto.dev.

Example:
    >>> facts = {0: {"taken": 10.0, "calls": [{"kind": "call", "seq": 0, "function": "step", "index": 0,
    ...              "start": 8.0, "returned": 8.5, "ready": 9.0, "thread": "MainThread"}], "threads": []}}
    >>> events = trace_events(facts)
    >>> [(e["name"], e["dur"]) for e in events if e["ph"] == "X"]
    [('step #0', 1000000.0)]
"""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
from typing import Any

from jaxdbg.hang.states import short


def trace_events(records: dict[int, dict]) -> list[dict]:
    """Chrome trace events of the records' calls (microseconds from the earliest start)."""
    starts = [c["start"] for r in records.values() for c in r.get("calls") or () if c.get("start")]
    t0 = min(starts, default=0.0)
    events: list[dict] = []
    for index, record in sorted(records.items()):
        taken = float(record.get("taken") or max(starts, default=t0))
        events.append({"ph": "M", "name": "process_name", "pid": index, "args": {"name": f"process {index}"}})
        threads: dict[str, int] = {}
        for call in record.get("calls") or ():
            tid = threads.setdefault(str(call.get("thread") or "MainThread"), len(threads))
            end = call.get("ready") or call.get("returned")
            name = f"{call['function']} #{call['index']}" if call.get("kind") == "call" else \
                f"callback {call['function']}"
            state = "done" if end else ("never returned" if call.get("returned") is None else "results never ready")
            if not end:
                name += f" ({state})"
            events.append({"ph": "X", "name": name, "pid": index, "tid": tid, "ts": (call["start"] - t0) * 1e6,
                           "dur": ((end or taken) - call["start"]) * 1e6,
                           "args": {"seq": call.get("seq"), "step": call.get("step"), "state": state,
                                    "called at": short(call.get("site")), "error": call.get("error")}})
        for thread, tid in threads.items():
            events.append({"ph": "M", "name": "thread_name", "pid": index, "tid": tid, "args": {"name": thread}})
        main = next((t for t in record.get("threads") or () if t.get("main")), None)
        where = (main or {}).get("user") or record.get("user")
        if where:
            events.append({"ph": "i", "s": "p", "name": f"stands at {short(where)}", "pid": index, "tid": 0,
                           "ts": (taken - t0) * 1e6})
    return events


def write_timeline(facts: Any, result: Any, folder: str) -> dict[str, str]:
    """``timeline.json`` (Perfetto) and ``timeline.png`` (when matplotlib is installed) in ``folder``."""
    records = facts.records
    if not any(record.get("calls") for record in records.values()):
        return {}
    found = {}
    path = os.path.join(folder, "timeline.json")
    with open(path, "w") as handle:
        json.dump({"traceEvents": trace_events(records), "displayTimeUnit": "ms"}, handle)
    found["timeline"] = os.path.abspath(path)
    with contextlib.suppress(ImportError):
        found["timeline_png"] = os.path.abspath(draw(records, result, os.path.join(folder, "timeline.png")))
    return found


def draw(records: dict[int, dict], result: Any, path: str) -> str:
    """A picture of the last calls: a row per process, seconds before the snapshot, each row ending with where
    the process stood."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taken = max(float(r.get("taken") or 0.0) for r in records.values()) or max(
        c["start"] for r in records.values() for c in r.get("calls") or ())
    names = sorted({c["function"] for r in records.values() for c in r.get("calls") or ()})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    figure, axes = plt.subplots(figsize=(11, 1.2 + 0.7 * len(records)))
    for row, (_, record) in enumerate(sorted(records.items())):
        for call in record.get("calls") or ():
            end = call.get("ready") or call.get("returned")
            start, stop = call["start"] - taken, (end or taken) - taken
            y = row + (0.3 if call.get("kind") == "callback" else 0.0)
            axes.broken_barh([(start, max(stop - start, 1e-4))], (y - 0.25, 0.5 if call.get("kind") == "call" else 0.2),
                             facecolors=colours[call["function"]], edgecolor="red" if not end else "none",
                             hatch="//" if not end else None, linewidth=1.5)
    states = {p.index: p for p in getattr(result, "processes", ())}
    for row, index in enumerate(sorted(records)):
        state = states.get(index)
        if state is not None:
            said = f" {state.state}" + (f" at {short(state.source)}" if state.source else "")
            axes.annotate(said, (0, row), fontsize="small", va="center", color="red" if index in result.stuck else "k")
    starts = [c["start"] - taken for r in records.values() for c in r.get("calls") or ()]
    span = max(-min(starts, default=-1.0), 1e-3)
    axes.set_xlim(-span * 1.05, span * 0.6)
    axes.axvline(0, color="grey", linewidth=0.8)
    axes.set_yticks(range(len(records)), [f"process {i}" for i in sorted(records)])
    axes.set_xlabel("seconds before the snapshot (hatched: never finished)")
    axes.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    axes.legend(handles, names, loc="upper left", fontsize="small", ncol=min(len(names), 4))
    axes.set_title("\n".join(textwrap.wrap(result.verdict, 120)[:3]), fontsize="small", loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
