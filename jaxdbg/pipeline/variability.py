"""Runtime variability: a SPEC grammar and seeded draws of every task's and message's duration.

SPEC is ``none`` or models joined with ``+``, each ``name:key=value,...``:

- ``jitter:cv=0.3``: every task's time times a lognormal factor of mean 1 and this coefficient of variation.
- ``straggler:stage=2,factor=2,prob=0.1``: with probability ``prob``, a stage (``stage``; any stage when
  omitted) runs all its work on a microbatch ``factor`` times slower (a throttled or shared device).
- ``multimodal:heavy=0.3,factor=3[,encoder=K][,rest=2][,light=1][,length=0][,partition=balanced]``:
  microbatches of two modalities. A ``heavy`` share (say, image+text among text-only) costs ``factor``
  units on the first ``K`` model stages, which hold the encoder (default a quarter of them, at least one),
  and ``rest`` units on the others: its image tokens join the text in the language model's sequence (the
  default 2: a LLaVA-style image adds 576 tokens beside a few hundred of text, about doubling the tokens on
  every language stage; ``rest=1`` makes images cost extra on the encoder alone). The others cost ``light``
  units on the encoder stages (below 1 when the encoder has little to do for text) and one unit elsewhere.
  ``partition`` says how layers were split into stages. ``balanced`` (the default), as pipeline
  partitioners do (Megatron's layer split, or a cost-model split): each stage's layers are chosen so that
  its *expected* load per microbatch is the base, so a stage's unit is the base divided by its mean
  units (encoder stages: ``heavy * factor + (1 - heavy) * light``); heavy microbatches still cost more
  than light ones there, by ``factor / light``, and that spread is the variability. ``layers``: the unit
  is the base on every stage, as when every stage gets the same number of layers whatever they hold, so
  the encoder stages carry more than the others on average (1.6x with the defaults) and bound any order.
  ``length`` (a coefficient of variation) scales every microbatch on every stage by a lognormal factor of
  mean 1: sequences of different lengths (it leaves the expected loads alone).
- ``comm:cv=0.5``: every message's delay times a lognormal factor with this coefficient of variation.
- ``replay:durations.json``: base durations measured in a real run (``pipeline-bench --mode real`` writes
  one per run); rows are model stages, microbatches repeat cyclically when the run has more.

Draws depend only on the spec, the seed and the number of model stages and microbatches, never on the
policy or schedule, so every policy meets the same realised durations (a paired comparison); a split
backward (I and W) shares its microbatch's draw.

Example:
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> var = parse_variability("jitter:cv=0.2+comm:cv=0.5", stages=4)
    >>> d = realise(var, PipelineShape(4, 8), Costs(), seed=0)
    >>> d.task.shape, bool(d.task.min() > 0)
    ((64,), True)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.tasks import BACKWARD, FORWARD, WEIGHT, PipelineShape

MODELS = ("none", "jitter", "straggler", "multimodal", "comm", "replay")
_HELP = (
    "use none, jitter:cv=0.3, straggler:stage=2,factor=2,prob=0.1, "
    "multimodal:heavy=0.3,factor=3[,encoder=K,rest=2,light=1,length=0,partition=balanced|layers], "
    "comm:cv=0.5 or replay:durations.json, joined with '+'"
)
# Parameters of each model: name -> (default, kind, lowest allowed, highest allowed); a str takes a value
# among the choices in the third place.
_PARAMS: dict[str, dict[str, tuple]] = {
    "none": {},
    "jitter": {"cv": (0.3, float, 0.0, None)},
    "straggler": {"stage": (None, int, 0, None), "factor": (2.0, float, 0.0, None), "prob": (0.1, float, 0.0, 1.0)},
    "multimodal": {
        "heavy": (0.3, float, 0.0, 1.0), "factor": (3.0, float, 0.0, None),
        "encoder": (None, int, 1, None), "rest": (2.0, float, 0.0, None),
        "light": (1.0, float, 0.0, None), "length": (0.0, float, 0.0, None),
        "partition": ("balanced", str, ("balanced", "layers"), None),
    },
    "comm": {"cv": (0.5, float, 0.0, None)},
}


@dataclass(frozen=True)
class Costs:
    """Base seconds per worker stage (before variability): a forward, a whole backward, a message.

    With several chunks per worker, each chunk's forward and backward take ``1/virtual`` of these.
    """

    forward_s: float = 0.004
    backward_s: float = 0.008
    comm_s: float = 0.0002
    input_grad_share: float = 0.5  # share of the backward that is the input gradient when split


@dataclass(frozen=True)
class Model:
    name: str
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Variability:
    """A parsed SPEC: its text and its models in order."""

    spec: str
    models: tuple[Model, ...]


@dataclass(frozen=True)
class Durations:
    """Realised seconds of every task, and of the message each task sends (0 where it sends none)."""

    shape: PipelineShape
    task: np.ndarray
    comm: np.ndarray
    heavy: np.ndarray  # per microbatch: drawn heavy by the multimodal model (all False otherwise)


def split_specs(text: str) -> list[str]:
    """A comma-separated list of SPECs (commas also separate a model's parameters: they stay with it)."""
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        starts_model = piece.split(":", 1)[0].split("+", 1)[0].strip() in MODELS
        if specs and not starts_model:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return [s for s in specs if s]


def parse_variability(spec: str, stages: int | None = None, model_stages: int | None = None) -> Variability:
    """Parse and check a SPEC; UsageError with one clear line when it is wrong."""
    models = []
    for part in (p.strip() for p in spec.split("+")):
        name, _, rest = part.partition(":")
        name = name.strip()
        if name not in MODELS:
            raise UsageError(f"--variability '{spec}': unknown model '{name}'; {_HELP}")
        if name == "replay":
            models.append(Model("replay", {"path": _replay_path(spec, rest.strip())}))
            continue
        models.append(Model(name, _parse_params(spec, name, rest, stages, model_stages)))
    return Variability(spec, tuple(models))


def _replay_path(spec: str, path: str) -> str:
    if not path:
        raise UsageError(f"--variability '{spec}': replay needs a file, e.g. replay:durations.json")
    if not os.path.isfile(path):
        raise UsageError(f"--variability '{spec}': no file '{path}'; give a durations.json written by --mode real")
    return path


def _parse_params(spec: str, name: str, text: str, stages: int | None, model_stages: int | None) -> dict:
    known = _PARAMS[name]
    values = {key: default for key, (default, *_rest) in known.items()}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if key not in known or not eq:
            keys = ", ".join(known) or "no parameters"
            raise UsageError(f"--variability '{spec}': '{item}' is not a parameter of {name} (it takes {keys})")
        _default, kind, low, high = known[key]
        if kind is str:
            value = raw.strip()
            if value not in low:
                raise UsageError(f"--variability '{spec}': {name} {key}='{raw}' is not one of {', '.join(low)}")
            values[key] = value
            continue
        try:
            value = kind(raw.strip())
        except ValueError:
            raise UsageError(f"--variability '{spec}': {name} {key}='{raw}' is not a {kind.__name__}") from None
        if ((low is not None and value < low) or (high is not None and value > high)
                or (kind is float and not math.isfinite(value))):
            bounds = f"at least {low}" if high is None else f"between {low} and {high}"
            raise UsageError(f"--variability '{spec}': {name} {key}={raw} must be {bounds}")
        values[key] = value
    for key in ("factor", "rest", "light"):
        if key in values and values[key] <= 0:
            raise UsageError(f"--variability '{spec}': {name} {key} must be positive")
    if name == "straggler" and stages is not None and values["stage"] is not None and values["stage"] >= stages:
        raise UsageError(f"--variability '{spec}': straggler stage={values['stage']} but stages are 0..{stages - 1}")
    if (name == "multimodal" and model_stages is not None and values["encoder"] is not None
            and values["encoder"] > model_stages):
        raise UsageError(f"--variability '{spec}': encoder={values['encoder']} exceeds the {model_stages} model stages")
    return values


def realise(variability: Variability, shape: PipelineShape, costs: Costs, seed: int) -> Durations:
    """Draw every task's and message's duration for one seed (identical for every policy)."""
    S, m, p = shape.model_stages, shape.microbatches, shape.stages
    rng = np.random.default_rng(seed)
    # Work per (forward|backward, model stage, microbatch) and message delay per the same.
    work = np.empty((2, S, m))  # a model stage holds 1/virtual of a worker's layers
    work[FORWARD], work[BACKWARD] = costs.forward_s / shape.virtual, costs.backward_s / shape.virtual
    comm = np.full((2, S, m), costs.comm_s)
    heavy = np.zeros(m, dtype=bool)
    input_share = costs.input_grad_share
    for model in variability.models:
        params = model.params
        if model.name == "replay":
            work, comm, input_share = _replay(params["path"], variability.spec, S, m, comm, input_share)
        elif model.name == "jitter":
            work = work * _lognormal(rng, params["cv"], work.shape)
        elif model.name == "comm":
            comm = comm * _lognormal(rng, params["cv"], comm.shape)
        elif model.name == "straggler":
            slow = rng.random((p, m)) < params["prob"]
            if params["stage"] is not None:
                slow[np.arange(p) != params["stage"]] = False
            per_stage = slow[np.arange(S) % p]  # every chunk of a slowed worker
            work = work * np.where(per_stage, params["factor"], 1.0)[None]
        elif model.name == "multimodal":
            drawn = rng.random(m) < params["heavy"]
            heavy |= drawn
            encoder = np.arange(S)[:, None] < (params["encoder"] or max(1, S // 4))
            heavy_cost = np.where(encoder, params["factor"], params["rest"])
            light_cost = np.where(encoder, params["light"], 1.0)
            if params["partition"] == "balanced":  # each stage's expected units per microbatch come to one
                mean = params["heavy"] * heavy_cost + (1 - params["heavy"]) * light_cost
                heavy_cost, light_cost = heavy_cost / mean, light_cost / mean
            scale = np.where(drawn[None, :], heavy_cost, light_cost)
            if params["length"] > 0:  # drawn after the modalities, so length=0 leaves earlier draws alone
                scale = scale * _lognormal(rng, params["length"], m)[None, :]
            work = work * scale[None]
    task = np.zeros((shape.kinds, S, m))
    task[FORWARD] = work[FORWARD]
    if shape.split:
        task[BACKWARD] = work[BACKWARD] * input_share
        task[WEIGHT] = work[BACKWARD] * (1 - input_share)
    else:
        task[BACKWARD] = work[BACKWARD]
    message = np.zeros((shape.kinds, S, m))
    message[FORWARD], message[BACKWARD] = comm[FORWARD], comm[BACKWARD]
    graph = shape.graph()
    message = np.where(np.asarray(graph.remote) >= 0, message.reshape(-1), 0.0)
    return Durations(shape, task.reshape(-1), message, heavy)


def _lognormal(rng: np.random.Generator, cv: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Factors of mean 1 and coefficient of variation ``cv``."""
    if cv == 0:
        return np.ones(size)
    sigma2 = math.log1p(cv * cv)
    return rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), size)


def _replay(path: str, spec: str, S: int, m: int, comm: np.ndarray, input_share: float):
    try:
        with open(path) as handle:
            data = json.load(handle)
        forward = np.asarray(data["forward"], dtype=float)
        backward = np.asarray(data["backward"], dtype=float)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(
            f"--variability '{spec}': cannot read '{path}' ({type(err).__name__}: {err}); "
            "it needs 'forward' and 'backward' lists of per-stage, per-microbatch seconds"
        ) from None
    if forward.ndim != 2 or forward.shape != backward.shape or forward.shape[0] != S or forward.shape[1] < 1:
        raise UsageError(
            f"--variability '{spec}': '{path}' holds {forward.shape} forward durations; this run needs {S} model "
            "stages (rows) and at least one microbatch (column)"
        )
    if (forward < 0).any() or (backward < 0).any():
        raise UsageError(f"--variability '{spec}': '{path}' holds negative durations")
    cols = np.arange(m) % forward.shape[1]
    work = np.stack([forward[:, cols], backward[:, cols]])
    if "comm" in data:
        recorded = np.asarray(data["comm"], dtype=float)
        if recorded.shape == (2, S, forward.shape[1]):
            comm = recorded[:, :, cols]
    if "input_grad" in data:
        input_grad = np.asarray(data["input_grad"], dtype=float)
        if input_grad.shape == forward.shape:
            total = float(backward.sum())
            input_share = float(input_grad.sum()) / total if total > 0 else input_share
    return work, comm, input_share
