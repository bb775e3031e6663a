"""Sequence lengths per microbatch, and what a microbatch of such sequences costs a pipeline stage.

The ``seqlen`` variability model (:mod:`jaxdbg.pipeline.variability`) draws, for every microbatch, the
lengths of its ``batch`` sequences: from a lognormal distribution (``mean``, ``cv``; the shape real length
histograms of text corpora roughly have), clipped to ``min``..``max`` (a context window), or sampled with
replacement from a file of real lengths (``file=``: numbers separated by whitespace, commas or newlines, or
a JSON list). A transformer layer's time for a sequence is a linear part (projections, MLP) and a part
quadratic in the length (attention scores); at the mean length ``attention`` is the quadratic part's share:

    cost(L) = (1 - attention) * r + attention * r**2,   r = L / mean length

so a mean-length sequence costs one unit, and a microbatch the mean of its sequences' units, on every
stage (every layer sees the same tokens). Lengths are known when the microbatch is formed, so the cost is
part of what a runtime can plan with (:attr:`Durations.expected <jaxdbg.pipeline.variability.Durations>`).

Example:
    >>> import numpy as np
    >>> length_cost(np.array([[512], [1024], [2048]]), mean=1024.0, attention=0.2).round(2).tolist()
    [0.45, 1.0, 2.4]
    >>> lengths, mean = draw_lengths({"mean": 1024.0, "cv": 0.5, "min": 1.0, "max": None, "batch": 2,
    ...                               "file": None}, microbatches=3, rng=np.random.default_rng(0), spec="")
    >>> lengths.shape, mean
    ((3, 2), 1024.0)
"""

from __future__ import annotations

import json
import math

import numpy as np

from jaxdbg._errors import UsageError

DEFAULT_MEAN, DEFAULT_CV = 1024.0, 0.5


def check_length_params(where: str, values: dict) -> None:
    """The seqlen parameters that only make sense together (UsageError naming the conflict)."""
    if values["file"] is not None and (values["mean"] is not None or values["cv"] is not None):
        raise UsageError(f"{where}: seqlen file= gives the lengths; drop mean= and cv= (they describe a drawn "
                         "distribution)")
    if values["max"] is not None and values["max"] < values["min"]:
        raise UsageError(f"{where}: seqlen max={values['max']:g} is below min={values['min']:g}")
    if values["file"] is not None:
        read_lengths(values["file"], where)  # a bad file is bad input before any run


def read_lengths(path: str, where: str = "--variability") -> np.ndarray:
    """The positive lengths in ``path`` (numbers separated by whitespace, commas or newlines, or a JSON list)."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as err:
        raise UsageError(f"{where}: cannot read '{path}' ({err.strerror})") from None
    try:
        if text.lstrip().startswith("["):
            values = [float(x) for x in json.loads(text)]
        else:
            values = [float(x) for x in text.replace(",", " ").split()]
    except (ValueError, TypeError):
        raise UsageError(f"{where}: '{path}' holds something that is not a number; give one length (tokens) per "
                         "line, or a JSON list") from None
    lengths = np.asarray(values, dtype=float)
    if lengths.size == 0 or not np.all(np.isfinite(lengths)) or lengths.min() <= 0:
        raise UsageError(f"{where}: '{path}' must hold at least one length, every one a positive number of tokens")
    return lengths


def draw_lengths(params: dict, microbatches: int, rng: np.random.Generator, spec: str) -> tuple[np.ndarray, float]:
    """``(lengths, mean)``: per microbatch, its ``batch`` sequences' lengths, and the mean length costs scale by."""
    size = (microbatches, params["batch"])
    if params["file"] is not None:
        pool = read_lengths(params["file"], f"--variability '{spec}'")
        lengths = rng.choice(pool, size=size, replace=True)
        mean = float(pool.mean())
    else:
        mean = params["mean"] if params["mean"] is not None else DEFAULT_MEAN
        cv = params["cv"] if params["cv"] is not None else DEFAULT_CV
        sigma2 = math.log1p(cv * cv)
        lengths = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size) if cv > 0 else np.full(size, mean)
    lengths = np.clip(np.round(lengths), params["min"], params["max"] if params["max"] is not None else np.inf)
    return lengths, mean


def length_cost(lengths: np.ndarray, mean: float, attention: float) -> np.ndarray:
    """Per microbatch (rows of ``lengths``), its cost in units of a mean-length sequence's."""
    r = np.asarray(lengths, dtype=float) / mean
    return ((1 - attention) * r + attention * r * r).mean(axis=-1)
