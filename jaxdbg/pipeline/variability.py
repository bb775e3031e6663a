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

Real causes (see :mod:`jaxdbg.pipeline.lengths` for the length model):

- ``seqlen:mean=1024,cv=0.5[,min=1][,max=L][,batch=1][,attention=0.2]`` or ``seqlen:file=lengths.txt[,...]``:
  each microbatch holds ``batch`` sequences whose lengths are drawn from a lognormal distribution (mean and
  coefficient of variation, clipped to ``min``..``max``) or sampled from a file of real lengths; on every
  stage a sequence costs ``(1 - attention) * r + attention * r**2`` units, ``r`` its length over the mean
  (attention is quadratic in the length; ``attention`` is its share of a mean-length sequence's time).
- ``hetero:encoder=K,factor=1.5`` or ``hetero:costs=1.5/1.5/1/1``: stages that cost differently whatever the
  data (a vision encoder beside the language model, a partition that could not balance them): the first
  ``K`` model stages cost ``factor`` times the others, or each model stage its own multiple.
- ``link:stage=S,factor=10[,cv=0]``: the link between stages ``S`` and ``S + 1`` (default: the middle one,
  where a job spans two hosts) carries messages ``factor`` times slower, each times a lognormal ``cv``.
- A straggling stage is ``straggler:stage=S,factor=1.5,prob=1`` (always slow), a flaky one ``prob`` below 1.

What a runtime can know before it runs (a microbatch's modality and lengths, the stages' partition) is
kept apart from noise (jitter, stragglers, message delays) in :attr:`Durations.expected`: readiness-first
policies plan with it (:mod:`jaxdbg.pipeline.planner`); only the realised durations are simulated.

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

MODELS = ("none", "jitter", "straggler", "multimodal", "comm", "replay", "seqlen", "hetero", "link")
_HELP = (
    "use none, jitter:cv=0.3, straggler:stage=2,factor=2,prob=0.1, "
    "multimodal:heavy=0.3,factor=3[,encoder=K,rest=2,light=1,length=0,partition=balanced|layers], "
    "comm:cv=0.5, replay:durations.json, seqlen:mean=1024,cv=0.5[,min=1,max=L,batch=1,attention=0.2] (or "
    "seqlen:file=lengths.txt), hetero:encoder=K,factor=1.5 (or hetero:costs=A/B/...), link:stage=S,factor=10, "
    "joined with '+'"
)
# Parameters of each model: name -> (default, kind, lowest allowed, highest allowed); a str takes a value
# among the choices in the third place, "path" an existing file, "floats" '/'-separated positive numbers.
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
    "seqlen": {
        "mean": (None, float, 1.0, None), "cv": (None, float, 0.0, None), "min": (1.0, float, 1.0, None),
        "max": (None, float, 1.0, None), "batch": (1, int, 1, None), "attention": (0.2, float, 0.0, 1.0),
        "file": (None, "path", None, None),
    },
    "hetero": {
        "encoder": (None, int, 1, None), "factor": (1.5, float, 0.0, None), "costs": (None, "floats", None, None),
    },
    "link": {"stage": (None, int, 0, None), "factor": (10.0, float, 0.0, None), "cv": (0.0, float, 0.0, None)},
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
    expected: np.ndarray | None = None  # per task: what a runtime knows before running (None: no variability)
    lengths: np.ndarray | None = None  # per microbatch: its tokens, when a seqlen model drew them

    def known(self) -> np.ndarray:
        """Per task, the seconds a runtime can expect before running it: :attr:`expected`, or each (kind,
        stage)'s mean over microbatches where nothing is known of single microbatches."""
        if self.expected is not None:
            return self.expected
        shape = self.shape
        per_slot = self.task.reshape(shape.kinds * shape.model_stages, shape.microbatches).mean(axis=1)
        return np.repeat(per_slot, shape.microbatches)


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
        values[key] = _parse_value(spec, name, key, raw.strip(), known[key][1:])
    for key in ("factor", "rest", "light"):
        if key in values and values[key] <= 0:
            raise UsageError(f"--variability '{spec}': {name} {key} must be positive")
    _check_model(spec, name, values, stages, model_stages)
    return values


def _parse_value(spec: str, name: str, key: str, raw: str, rule: tuple) -> object:
    """One parameter's value checked against its rule ``(kind, low, high)`` (see ``_PARAMS``)."""
    kind, low, high = rule
    where = f"--variability '{spec}': {name} {key}"
    if kind is str:
        if raw not in low:
            raise UsageError(f"{where}='{raw}' is not one of {', '.join(low)}")
        return raw
    if kind == "path":
        if not os.path.isfile(raw):
            raise UsageError(f"{where}: no file '{raw}'; give the path of an existing file")
        return raw
    if kind == "floats":
        try:
            numbers = tuple(float(x) for x in raw.split("/"))
        except ValueError:
            raise UsageError(f"{where}='{raw}' is not '/'-separated numbers, e.g. 1.5/1/1/1") from None
        if not all(math.isfinite(x) and x > 0 for x in numbers):
            raise UsageError(f"{where}='{raw}': every cost must be a positive number")
        return numbers
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(f"{where}='{raw}' is not a {kind.__name__}") from None
    if (low is not None and value < low) or (high is not None and value > high) or (
            kind is float and not math.isfinite(value)):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        finite = "a finite number " if kind is float else ""  # "factor=inf must be at least 0.0" was a riddle
        raise UsageError(f"{where}={raw} must be {finite}{bounds}")
    return value


def _check_model(spec: str, name: str, values: dict, stages: int | None, model_stages: int | None) -> None:
    """Checks across a model's parameters, and against the pipeline's stages where they are known."""
    where = f"--variability '{spec}'"
    if name in ("straggler", "link") and stages is not None and values["stage"] is not None and values[
            "stage"] >= stages:
        raise UsageError(f"{where}: {name} stage={values['stage']} but stages are 0..{stages - 1}")
    if name in ("multimodal", "hetero") and model_stages is not None and (values["encoder"] or 0) > model_stages:
        raise UsageError(f"{where}: encoder={values['encoder']} exceeds the {model_stages} model stages")
    if name == "hetero" and values["costs"] is not None and model_stages is not None and len(
            values["costs"]) != model_stages:
        raise UsageError(f"{where}: hetero costs= lists {len(values['costs'])} stage costs for {model_stages} model "
                         "stages; give one per model stage, '/'-separated")
    if name == "seqlen":
        from jaxdbg.pipeline.lengths import check_length_params

        check_length_params(where, values)


def realise(variability: Variability, shape: PipelineShape, costs: Costs, seed: int) -> Durations:
    """Draw every task's and message's duration for one seed (identical for every policy)."""
    S, m = shape.model_stages, shape.microbatches
    draw = _Draw(shape, variability.spec, np.random.default_rng(seed), costs)
    for model in variability.models:
        _APPLY[model.name](draw, model.params)
    task = np.zeros((shape.kinds, S, m))
    known = np.zeros((shape.kinds, S, m))
    for out, work in ((task, draw.work), (known, draw.known)):
        out[FORWARD] = work[FORWARD]
        if shape.split:
            out[BACKWARD] = work[BACKWARD] * draw.input_share
            out[WEIGHT] = work[BACKWARD] * (1 - draw.input_share)
        else:
            out[BACKWARD] = work[BACKWARD]
    message = np.zeros((shape.kinds, S, m))
    message[FORWARD], message[BACKWARD] = draw.comm[FORWARD], draw.comm[BACKWARD]
    graph = shape.graph()
    message = np.where(np.asarray(graph.remote) >= 0, message.reshape(-1), 0.0)
    return Durations(shape, task.reshape(-1), message, draw.heavy, known.reshape(-1), draw.lengths)


def noise_samples(variability: Variability, durations: Durations, costs: Costs, seed: int,
                  count: int) -> list[Durations]:
    """``count`` draws of what a runtime does not know beforehand (the noise: jitter, stragglers, message
    delays) around ``durations``' known part, from seeds other than ``seed``'s (the past steps a runtime has
    profiled, not this one): each task's known seconds times another draw's realised-over-known ratio; empty
    when the spec has no noise."""
    shape, known = durations.shape, durations.known()
    base = realise(parse_variability("none"), shape, costs, 0).comm
    samples = []
    for k in range(count):
        other = realise(variability, shape, costs, _SAMPLE_SEED + seed * 64 + k)
        ratio = np.divide(other.task, other.known(), out=np.ones_like(other.task), where=other.known() > 0)
        if k == 0 and np.allclose(ratio, 1.0) and np.allclose(other.comm, base):
            return []  # nothing unknown: the expected durations are the durations
        samples.append(Durations(shape, known * ratio, other.comm, durations.heavy, known, durations.lengths))
    return samples


_SAMPLE_SEED = 1_000_003  # noise samples' seeds start here, far from the seeds a bench pairs its runs on


class _Draw:
    """One seed's draw in progress: work per (forward|backward, model stage, microbatch), what of it a runtime
    knows before running (``known``: modality, lengths, the partition; not noise), and each message's delay."""

    def __init__(self, shape: PipelineShape, spec: str, rng: np.random.Generator, costs: Costs):
        S, m = shape.model_stages, shape.microbatches
        self.shape, self.spec, self.rng = shape, spec, rng
        self.work = np.empty((2, S, m))  # a model stage holds 1/virtual of a worker's layers
        self.work[FORWARD], self.work[BACKWARD] = costs.forward_s / shape.virtual, costs.backward_s / shape.virtual
        self.known = self.work.copy()
        self.comm = np.full((2, S, m), costs.comm_s)
        self.heavy = np.zeros(m, dtype=bool)
        self.lengths: np.ndarray | None = None
        self.input_share = costs.input_grad_share

    def scale(self, factor: np.ndarray, known: bool) -> None:
        """Multiply the work by ``factor`` (broadcast over kind, stage, microbatch); ``known`` to the runtime too."""
        self.work = self.work * factor
        if known:
            self.known = self.known * factor


def _apply_replay(draw: _Draw, params: dict) -> None:
    S, m = draw.shape.model_stages, draw.shape.microbatches
    draw.work, draw.comm, draw.input_share = _replay(params["path"], draw.spec, S, m, draw.comm, draw.input_share)
    # Measured durations: what a runtime would know of them is each stage's mean, not each microbatch's.
    draw.known = np.broadcast_to(draw.work.mean(axis=2, keepdims=True), draw.work.shape).copy()


def _apply_jitter(draw: _Draw, params: dict) -> None:
    draw.scale(_lognormal(draw.rng, params["cv"], draw.work.shape), known=False)


def _apply_comm(draw: _Draw, params: dict) -> None:
    draw.comm = draw.comm * _lognormal(draw.rng, params["cv"], draw.comm.shape)


def _apply_straggler(draw: _Draw, params: dict) -> None:
    p, m, S = draw.shape.stages, draw.shape.microbatches, draw.shape.model_stages
    slow = draw.rng.random((p, m)) < params["prob"]
    if params["stage"] is not None:
        slow[np.arange(p) != params["stage"]] = False
    per_stage = slow[np.arange(S) % p]  # every chunk of a slowed worker
    draw.scale(np.where(per_stage, params["factor"], 1.0)[None], known=False)


def _apply_multimodal(draw: _Draw, params: dict) -> None:
    S, m = draw.shape.model_stages, draw.shape.microbatches
    drawn = draw.rng.random(m) < params["heavy"]
    draw.heavy |= drawn
    encoder = np.arange(S)[:, None] < (params["encoder"] or max(1, S // 4))
    heavy_cost = np.where(encoder, params["factor"], params["rest"])
    light_cost = np.where(encoder, params["light"], 1.0)
    if params["partition"] == "balanced":  # each stage's expected units per microbatch come to one
        mean = params["heavy"] * heavy_cost + (1 - params["heavy"]) * light_cost
        heavy_cost, light_cost = heavy_cost / mean, light_cost / mean
    scale = np.where(drawn[None, :], heavy_cost, light_cost)
    if params["length"] > 0:  # drawn after the modalities, so length=0 leaves earlier draws alone
        scale = scale * _lognormal(draw.rng, params["length"], m)[None, :]
    draw.scale(scale[None], known=True)  # a microbatch's images and tokens are known when it is formed


def _apply_seqlen(draw: _Draw, params: dict) -> None:
    from jaxdbg.pipeline.lengths import draw_lengths, length_cost

    lengths, mean = draw_lengths(params, draw.shape.microbatches, draw.rng, draw.spec)
    draw.lengths = lengths if draw.lengths is None else draw.lengths + lengths
    draw.scale(length_cost(lengths, mean, params["attention"])[None, None, :], known=True)


def _apply_hetero(draw: _Draw, params: dict) -> None:
    S = draw.shape.model_stages
    if params["costs"] is not None:
        if len(params["costs"]) != S:
            raise UsageError(
                f"--variability '{draw.spec}': hetero costs= lists {len(params['costs'])} stage costs for {S} model "
                "stages; give one per model stage, '/'-separated")
        per_stage = np.asarray(params["costs"], dtype=float)
    else:
        per_stage = np.where(np.arange(S) < (params["encoder"] or max(1, S // 4)), params["factor"], 1.0)
    draw.scale(per_stage[None, :, None], known=True)  # the partition is known before the run


def _apply_link(draw: _Draw, params: dict) -> None:
    p, S = draw.shape.stages, draw.shape.model_stages
    link = params["stage"] if params["stage"] is not None else max(p // 2 - 1, 0)
    sender = np.arange(S) % p
    # A forward goes from model stage k to k + 1, a backward from k to k - 1; either way it crosses the link
    # between workers `link` and `link + 1` (mod p) when its two ends are those workers.
    ends = {link, (link + 1) % p}
    crosses = np.zeros((2, S), dtype=bool)
    crosses[FORWARD] = [{sender[k], (k + 1) % p} == ends for k in range(S)]
    crosses[BACKWARD] = [{sender[k], (k - 1) % p} == ends for k in range(S)]
    factor = params["factor"] * _lognormal(draw.rng, params["cv"], draw.comm.shape)
    draw.comm = np.where(crosses[:, :, None], draw.comm * factor, draw.comm)


_APPLY = {"none": lambda draw, params: None, "replay": _apply_replay, "jitter": _apply_jitter, "comm": _apply_comm,
          "straggler": _apply_straggler, "multimodal": _apply_multimodal, "seqlen": _apply_seqlen,
          "hetero": _apply_hetero, "link": _apply_link}


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
