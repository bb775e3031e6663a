"""The memory report's files: the raw data as CSV, and pictures of memory over the run per device with the
peak marked and the breakdown at the peak: ``memory.html`` (always; an inline SVG, opens in any browser,
nothing fetched) and, with ``--plot``, ``memory.png`` (matplotlib, when installed: the ``plot`` extra).

Example:
    >>> import tempfile
    >>> from jaxdbg.memory.messages import SampleRow
    >>> rows = [SampleRow(0.1 * i, "step", i, {"cpu:0": 1000 * i}, {"cpu:0": 1500 * i}) for i in range(5)]
    >>> paths = write_samples_csv(rows, tempfile.mkdtemp())
    >>> open(paths).read().splitlines()[1]
    't_s,function,call_index,device,live_bytes,estimate_bytes,in_use_bytes,peak_in_use_bytes'
"""

from __future__ import annotations

import contextlib
import csv
import html
import os
import threading
from collections.abc import Sequence
from typing import Any

from jaxdbg.memory.messages import SampleRow
from jaxdbg.memory.result import LiveGroup, MemoryResult, ProgramMemory, RunPeak
from jaxdbg.memory.units import format_bytes

_HEADER = "# jaxdbg memory: live bytes per device at call boundaries; estimate = live + what the call adds"


def write_samples_csv(rows: Sequence[SampleRow], folder: str) -> str:
    path = os.path.join(folder, "samples.csv")
    with open(path, "w", newline="") as handle:
        handle.write(_HEADER + "\n")
        writer = csv.writer(handle)
        writer.writerow(["t_s", "function", "call_index", "device", "live_bytes", "estimate_bytes", "in_use_bytes",
                         "peak_in_use_bytes"])
        for row in rows:
            for device in sorted(set(row.live) | set(row.estimate)):
                writer.writerow([f"{row.t:.6f}", row.function or "", "" if row.call_index is None else row.call_index,
                                 device, row.live.get(device, 0), row.estimate.get(device, 0),
                                 row.in_use.get(device, ""), row.peak_in_use.get(device, "")])
    return path


def write_tables(result: MemoryResult, folder: str) -> dict[str, str]:
    """functions.csv, buffers.csv and live_at_peak.csv."""
    paths = {name: os.path.join(folder, f"{name}.csv") for name in ("functions", "buffers", "live_at_peak")}
    with open(paths["functions"], "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["function", "compile_index", "call_index", "signature", "argument_bytes", "output_bytes",
                         "alias_bytes", "temp_bytes", "code_bytes", "peak_bytes", "schedule_peak_bytes",
                         "needs_bytes", "fits", "over_bytes", "forward_kept_bytes", "recompiled_because"])
        for p in result.functions:
            writer.writerow([p.name, p.compile_index, p.call_index, p.signature, p.argument_bytes, p.output_bytes,
                             p.alias_bytes, p.temp_bytes, p.code_bytes, p.peak_bytes, _blank(p.schedule_peak_bytes),
                             _blank(p.needs_bytes), _blank(p.fits), _blank(p.over_bytes), p.forward_kept_bytes,
                             _blank(p.recompiled_because)])
    with open(paths["buffers"], "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["function", "compile_index", "buffer", "kind", "bytes", "shape", "op", "op_name", "pass",
                         "argument", "output", "file", "line"])
        for p in result.functions:
            for b in p.largest:
                writer.writerow([p.name, p.compile_index, b.name, b.kind, b.bytes, b.shape, b.op or "", b.op_name,
                                 b.pass_ or "", b.argument or "", b.output or "", b.source.file if b.source else "",
                                 b.source.line if b.source else ""])
    with open(paths["live_at_peak"], "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["producer", "file", "line", "arrays", "bytes", "calls", "shapes"])
        for g in result.live_at_peak:
            writer.writerow([g.producer, g.source.file if g.source else "", g.source.line if g.source else "",
                             g.arrays, g.bytes, g.calls, g.shapes])
    return paths


def _blank(value: Any) -> Any:
    return "" if value is None else value


def series(rows: Sequence[SampleRow]) -> dict[str, tuple[list[float], list[int], list[int]]]:
    """Per device: times, live bytes and estimates, in order."""
    found: dict[str, tuple[list[float], list[int], list[int]]] = {}
    for row in rows:
        for device in set(row.live) | set(row.estimate):
            t, live, estimate = found.setdefault(device, ([], [], []))
            t.append(row.t)
            live.append(row.live.get(device, 0))
            estimate.append(row.estimate.get(device, 0))
    return dict(sorted(found.items()))


def breakdown(peak: RunPeak | None, groups: Sequence[LiveGroup], limit: int = 6) -> list[tuple[str, int]]:
    """What made up the peak: the largest live groups, the rest of the live arrays, and what the call added."""
    if peak is None:
        return []
    parts = [(f"{g.producer} ({_where(g)})" if g.source else g.producer, g.bytes) for g in groups[:limit]]
    rest = peak.live_bytes - sum(size for _, size in parts)
    if rest > 0:
        parts.append(("other live arrays", rest))
    if peak.program_bytes > 0:
        parts.append((f"{peak.function or 'the call'}: its outputs and temporaries", peak.program_bytes))
    return parts


def _where(group: LiveGroup) -> str:
    return f"{os.path.basename(group.source.file)}:{group.source.line}" if group.source else ""


def load_matplotlib() -> threading.Thread:
    """Import matplotlib for :func:`write_png` on a daemon thread, started while the run goes on: the parent only
    waits for its child then, and the import (about half a second, longer than drawing) is off the command's
    path. Join it before drawing (an import the main thread starts meanwhile waits for it anyway)."""
    thread = threading.Thread(target=_import_matplotlib, name="jaxdbg-memory-matplotlib", daemon=True)
    thread.start()
    return thread


def _import_matplotlib() -> Any:
    """matplotlib's ``Figure`` and Agg canvas (no pyplot: no global figure state, nothing to close), or None
    without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # the plot extra: lazily, only for a picture
        from matplotlib.figure import Figure
    except ImportError:
        return None
    with contextlib.suppress(Exception):  # the font, read at the first text drawn: read it now too
        from matplotlib import font_manager

        font_manager.get_font(font_manager.findfont(font_manager.FontProperties()))
    return Figure, FigureCanvasAgg


def write_png(result: MemoryResult, rows: Sequence[SampleRow], path: str) -> str | None:
    """memory.png: memory over the run per device (peak marked) and the breakdown at the peak; None without
    matplotlib. Laid out by hand (fixed margins, no tick labels on the breakdown, whose legend says each part's
    size): text layout is most of a picture's time, and tight_layout measures every text twice."""
    found = _import_matplotlib()
    if found is None:
        return None
    Figure, FigureCanvasAgg = found
    figure = Figure(figsize=(12, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    left = figure.add_axes((0.07, 0.11, 0.545, 0.8))  # room for 6-digit MiB ticks (80 GiB) and the label
    right = figure.add_axes((0.65, 0.11, 0.05, 0.8))
    for device, (t, live, estimate) in series(rows).items():
        line = left.plot(t, [v / 2**20 for v in live], drawstyle="steps-post", label=f"{device} live arrays")[0]
        left.plot(t, [v / 2**20 for v in estimate], drawstyle="steps-post", linestyle="--", color=line.get_color(),
                  alpha=0.6, label=f"{device} live + call")
    peak = result.peak
    if peak is not None:
        at = next((r.t for r in rows if r.function == peak.function and r.call_index == peak.call_index), None)
        if at is not None:
            left.plot([at], [peak.bytes / 2**20], "o", color="red", zorder=5)
            left.annotate(f"peak {format_bytes(peak.bytes)}\n{peak.function} call {peak.call_index}",
                          (at, peak.bytes / 2**20), textcoords="offset points", xytext=(8, -24), color="red")
    if result.budget.device_memory_bytes:
        left.axhline(result.budget.device_memory_bytes / 2**20, color="black", linestyle=":", label="budget")
    left.set_xlabel("seconds into the run")
    left.set_ylabel("MiB per device")
    left.set_ylim(bottom=0)
    left.set_title("device memory at call boundaries")
    left.legend(fontsize=7, loc="lower right")
    parts = breakdown(peak, result.live_at_peak)
    bottom = 0.0
    for label, size in parts:
        right.bar([0], [size / 2**20], width=0.8, bottom=bottom, label=f"{label}: {format_bytes(size)}")
        bottom += size / 2**20
    right.set(xticks=[], yticks=[], xlim=(-0.4, 0.4), ylim=(0, bottom or 1))
    right.set_title(f"at the peak: {format_bytes(peak.bytes)} on {peak.device}" if peak else "no samples",
                    loc="left", fontsize=10)
    if parts:
        right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.1, 1.0), frameon=False)
    figure.savefig(path, pil_kwargs={"compress_level": 1})  # zlib's fastest: flat colours compress well anyway
    return path


def write_html(result: MemoryResult, rows: Sequence[SampleRow], path: str, title: str) -> str:
    """memory.html: the same two pictures as inline SVG, and the functions' table."""
    body = [f"<h1>jaxdbg memory: {html.escape(title)}</h1>", _svg_series(rows, result.peak),
            _html_breakdown(breakdown(result.peak, result.live_at_peak)), _html_functions(result.functions)]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>jaxdbg memory</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 8px;"
            "border-bottom:1px solid #ddd;text-align:right}td:first-child{text-align:left}</style></head><body>"
            + "".join(body) + "</body></html>\n")
    with open(path, "w") as handle:
        handle.write(page)
    return path


_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _svg_series(rows: Sequence[SampleRow], peak: RunPeak | None, width: int = 760, height: int = 300) -> str:
    data = series(rows)
    if not data:
        return "<p>No samples were taken (no jitted call ran).</p>"
    t_max = max(max(t) for t, _, _ in data.values()) or 1.0
    y_max = max(max(e) for _, _, e in data.values()) or 1
    pad = 50

    def xy(t: float, v: int) -> str:
        return f"{pad + t / t_max * (width - 2 * pad):.1f},{height - pad - v / y_max * (height - 2 * pad):.1f}"

    def steps(t: list[float], values: list[int]) -> str:
        """A value holds until the next sample: a step line, as the PNG draws it."""
        points = [xy(t[0], values[0])]
        for i in range(1, len(t)):
            points += [xy(t[i], values[i - 1]), xy(t[i], values[i])]
        return " ".join(points)

    lines = []
    for i, (device, (t, live, estimate)) in enumerate(data.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        lines.append(f"<polyline fill='none' stroke='{colour}' points='{steps(t, live)}'>"
                     f"<title>{device} live arrays</title></polyline>")
        lines.append(f"<polyline fill='none' stroke='{colour}' stroke-dasharray='4 3' opacity='0.6' "
                     f"points='{steps(t, estimate)}'><title>{device} live + call</title></polyline>")
        lines.append(f"<text x='{width - pad + 4}' y='{pad + 14 * i}' fill='{colour}' font-size='11'>{device}</text>")
    if peak is not None:
        at = next((r.t for r in rows if r.function == peak.function and r.call_index == peak.call_index), None)
        if at is not None:
            x, y = xy(at, peak.bytes).split(",")
            lines.append(f"<circle cx='{x}' cy='{y}' r='4' fill='red'/><text x='{float(x) + 6}' y='{float(y) + 14}' "
                         f"fill='red' font-size='11'>peak {format_bytes(peak.bytes)}: "
                         f"{html.escape(str(peak.function))} call {peak.call_index}</text>")
    axes = (f"<line x1='{pad}' y1='{height - pad}' x2='{width - pad}' y2='{height - pad}' stroke='#333'/>"
            f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{height - pad}' stroke='#333'/>"
            f"<text x='{pad}' y='{pad - 8}' font-size='11'>{format_bytes(y_max)}</text>"
            f"<text x='{width - pad}' y='{height - pad + 16}' font-size='11' text-anchor='end'>{t_max:.2f} s</text>")
    return (f"<h2>Device memory at call boundaries</h2><p>Solid: live arrays; dashed: live + what the call adds."
            f"</p><svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>{axes}{''.join(lines)}</svg>")


def _html_breakdown(parts: list[tuple[str, int]]) -> str:
    if not parts:
        return ""
    total = sum(size for _, size in parts) or 1
    rows = "".join(f"<tr><td>{html.escape(label)}</td><td>{format_bytes(size)}</td>"
                   f"<td><div style='background:#1f77b4;height:10px;width:{300 * size / total:.0f}px'></div></td></tr>"
                   for label, size in parts)
    return f"<h2>At the peak</h2><table>{rows}</table>"


def _html_functions(programs: Sequence[ProgramMemory]) -> str:
    if not programs:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("function", "arguments", "outputs", "aliased", "temporaries", "peak",
                                             "needs", "fits"))
    rows = "".join(
        f"<tr><td>{html.escape(p.name)}{f' #{p.compile_index}' if p.compile_index else ''}</td>"
        + "".join(f"<td>{format_bytes(v)}</td>" for v in (p.argument_bytes, p.output_bytes, p.alias_bytes,
                                                          p.temp_bytes, p.peak_bytes, p.needs_bytes))
        + f"<td>{'' if p.fits is None else ('yes' if p.fits else 'NO')}</td></tr>" for p in programs)
    return f"<h2>Jitted functions (per device)</h2><table><tr>{head}</tr>{rows}</table>"
