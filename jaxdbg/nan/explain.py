"""One paragraph in plain words, and fixes that fit the pattern found.

Each pattern is a small function of the origin (primitive, pass, input statistics, the code of the user's
line and of the lines that computed its inputs) that returns a sentence and hints, or None. The first
pattern that fits explains the origin. A NaN made of infinities (0 * inf, inf - inf) is explained by where
its infinity was born (the chain's first origin): that is what to fix, so its hints are the ones given.
Growth, precision and the strategy add their own sentences; growth is called divergence only when values
grew to a large magnitude, and not for an origin at a 0 or outside a domain (0/0, log(0)) that growth did
not cause.

Example:
    >>> from jaxdbg.nan.result import Origin, ValueStats
    >>> neg = ValueStats((2,), "f32", -1.0, 1.0, 0, 0, 0, 1)
    >>> text, hints = explain(Origin("nan", "log", "forward", None, "loss", 3, ("jit(loss)",), (neg,)))
    >>> "negative" in text, any("eps" in h for h in hints)
    (True, True)
"""

from __future__ import annotations

import io
import linecache
import math
import re
import tokenize
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jaxdbg import _compat
from jaxdbg._source import SourceLocation
from jaxdbg.nan import passes, schedule
from jaxdbg.nan.result import GrowthEntry, Origin, Overflow, PrecisionCheck, Strategy, ValueStats, inf_root

if TYPE_CHECKING:
    from jaxdbg.nan.analyses import Findings
    from jaxdbg.nan.cond_select import CondSelect
    from jaxdbg.nan.localise import Discarded
    from jaxdbg.nan.zero_source import ZeroSource

# (origin, code of its line, code of the lines that computed its inputs) -> (sentence, hints) or None
Pattern = Callable[[Origin, str, str], "tuple[str, list[str]] | None"]

DOUBLE_WHERE = ("use the double-where trick so the masked branch never sees a bad value: "
                "`safe = jnp.where(mask, x, 1.0); y = jnp.where(mask, f(safe), 0.0)` "
                "(a single where still sends 0 * inf = NaN into the gradient)")
EPSILON_LOG = "clamp the input away from zero: `jnp.log(jnp.maximum(x, 1e-12))` (or add a small epsilon)"
EPSILON_DIV = "keep the denominator away from zero: `x / jnp.maximum(d, 1e-12)` or `x / (d + 1e-12)`"
LOG_SUM_EXP = ("compute in log space: `jax.nn.logsumexp`, `jax.nn.log_softmax`, `jax.nn.log_sigmoid` "
               "instead of log(sum(exp(...))) / log(softmax) / log(sigmoid)")
LOG_SOFTMAX = ("use `jax.nn.log_softmax(logits)` instead of `jnp.log(jax.nn.softmax(logits))`, or the whole loss "
               "`optax.softmax_cross_entropy(logits, one_hot_labels)` (`..._with_integer_labels` for integer labels): "
               "softmax underflows to exactly 0 for large logit gaps, log_softmax never does")
LOG_SIGMOID = ("use `jax.nn.log_sigmoid(x)` (and `jax.nn.log_sigmoid(-x)` for log(1 - sigmoid(x))), or the whole loss "
               "`optax.sigmoid_binary_cross_entropy(logits, labels)`")
SQRT_EPSILON = ("add an epsilon inside: `jnp.sqrt(x + 1e-12)` (or take the square root only where x > 0, with the "
                "double-where trick)")
NORM_EPSILON = ("take the norm with an epsilon inside its square root: `jnp.sqrt(jnp.sum(x ** 2, axis) + 1e-12)` "
                "(`optax.safe_norm(x, 1e-12)`; of a pytree, `jnp.sqrt(optax.tree.norm(t, squared=True) + 1e-12)`) "
                "instead of `jnp.linalg.norm`, whose derivative at the zero vector is infinite")
POW_BASE = ("keep the base of the power away from zero: `jnp.maximum(x, 1e-6) ** gamma` (a power below 1 has an "
            "infinite derivative at 0)")
# left out where the line already adds an epsilon
EPSILONS = (EPSILON_LOG, EPSILON_DIV, SQRT_EPSILON, NORM_EPSILON, POW_BASE)
DEGENERATE = ("break the tie: add a tiny, fixed perturbation that makes the eigenvalues distinct (e.g. "
              "`m + 1e-5 * jnp.diag(jnp.arange(n))`), or differentiate a quantity that does not depend on the "
              "eigenvectors of repeated eigenvalues (a sum of eigenvalues, `jnp.trace`, a matrix function)")
DEGENERATE_BASIS = ("if the eigenvectors are not needed, take `jnp.linalg.eigvalsh` (its gradient is finite at "
                    "distinct eigenvalues) or `jax.lax.stop_gradient` them")
UNTAKEN_BRANCH = ("make the branch safe for the elements that do not take it (under vmap it runs on them too, and "
                  "its discarded NaN hides the one that matters from nan-hunt and from jax_debug_nans): give its "
                  "operation a harmless input there, with the cond's own predicate, e.g. "
                  "`jnp.log(jnp.where(pred, x, 1.0))` (the double-where trick), then run nan-hunt again")
CHOLESKY_JITTER = ("add a small jitter to the diagonal before factorising (`k + 1e-6 * jnp.eye(n)`, larger in "
                   "float32) and symmetrise it (`(k + k.T) / 2`)")
UNDERFLOW = ("keep the value that underflows away from 0: bound its input (e.g. `jnp.exp(jnp.maximum(x, -80.0))`) or "
             "use a form that cannot reach 0 (`jax.nn.softplus(x) + 1e-6` for a positive parameter); if its input "
             "is a parameter, find why it moved so far (a smaller learning rate, clipped gradients)")
LOG_NORMALISE = ("normalise in log space: `exp(a) / exp(a).sum()` is `jax.nn.softmax(a)`, which subtracts the largest "
                 "`a` first, so the largest term is 1 and the sum never underflows to 0 (for mixture weights or "
                 "responsibilities, `a = jnp.log(w) + log_p`); `log(sum(exp(a)))` is `jax.nn.logsumexp(a)`")
MASKED_MEAN = ("a fully masked batch or row (all padding) has nothing to average: divide by "
               "`jnp.maximum(mask.sum(), 1)` "
               "(its numerator is 0 too), and check the data pipeline for empty batches")
WEIGHTED_MEAN = ("every weight summed into the denominator is 0 there (an example, a batch or a device given only "
                 "zero weights, e.g. padding): divide by `jnp.maximum(weight.sum(), 1e-12)`, or give 0 where the "
                 "total is 0 (`jnp.where(total > 0, num / jnp.where(total > 0, total, 1.0), 0.0)`), and check why "
                 "every weight there is 0")
# Labels past the classes (an ignore index) one-hot to all-zero rows: the picked probability is 0.
ONE_HOT_RANGE = ("mask the labels outside [0, num_classes) out of the loss (an ignore index such as 255 or -100 "
                 "one-hots to an all-zero row, so the picked probability is 0): `valid = (labels >= 0) & (labels < "
                 "num_classes)`, average over the valid ones, or use `optax.softmax_cross_entropy_with_integer_labels` "
                 "on the clipped labels with that mask")
# A layer's own weight matrix divided by its norm (weight normalisation): zero-initialised, it has no direction.
ZERO_PARAMETER = ("initialise `{name}` with nonzero values: it is all zeros where the code divides by its norm (a "
                  "zero-initialised layer under weight normalisation has no direction); start a branch at zero through "
                  "its gain or a zeroed output layer instead, or divide by `jnp.maximum(norm, 1e-12)`")
EMPTY_SEGMENT = ("an empty segment (a node with no incoming edge, a class with no member in the batch) sums to 0: "
                 "divide by `jnp.maximum(count, 1)` (its sum is 0 too, so its mean becomes 0), or mask it out")
CAPTURED_ZERO = ("{name} holds a 0 where the code divides by it (or takes its log): fix the values it is built from "
                 "(e.g. clip a noise schedule away from 0 and 1), or skip those entries")
LITERAL_ZERO = ("{name} is 0 where the code divides by it (a warmup or decay length, a count set to 0 in a config): "
                "give it a non-zero value, or guard the formula for 0 (`max(WARMUP, 1)`)")
BOUND_EXP = ("bound what is exponentiated where it is a value of its own (a log-variance or log-scale head, a log "
             "ratio): `jnp.exp(jnp.clip(x, -20.0, 20.0))`, or map it to a positive value with `jax.nn.softplus` "
             "instead of exp")
XLOGY = ("where the factor is 0 the term is 0: write `p * log(q)` as `jax.scipy.special.xlogy(p, q)` (an entropy "
         "`-p * log(p)` as `jax.scipy.special.entr(p)`), which give 0 where p is 0 instead of 0 * -inf = NaN; for its "
         "gradient too, take the log only where p > 0: `jnp.log(jnp.where(p > 0, q, 1.0))` (the double-where trick)")
SUBTRACT_MAX = "subtract the maximum before exponentiating (what `jax.nn.softmax`/`logsumexp` do)"
CLIP = "clip gradients (e.g. `optax.clip_by_global_norm(1.0)`) and/or lower the learning rate (or add warmup)"
# CLIP's, where every gradient the call takes drives a loop of its own (a sampler's integrator, an inner solver).
CLIP_OR_STEP = (CLIP + "; where the gradient drives a loop of its own (a leapfrog/HMC or Langevin integrator, an inner "
                "optimisation), take a smaller step size there")
# CLIP's place where the call computes no gradient (an ODE solve, a simulation, a forward-only model).
BOUND = ("bound or rescale what grows without limit (an unstable iteration, an exploding ODE, a step too large): "
         "smaller steps, a clamp, or float64 (`jax.config.update('jax_enable_x64', True)`) to see whether it only "
         "needs more range")
ITERATED_MATMUL = ("normalise the matrix (by its Frobenius or spectral norm, e.g. `X = G / (jnp.linalg.norm(G) + "
                   "1e-7)`) before iterating: an iteration that multiplies it by itself (Newton-Schulz, matrix powers, "
                   "a polynomial iteration) only converges from entries of order 1, and from larger ones grows "
                   "geometrically, step after step")
UPCAST = "compute this part in float32 (`x.astype(jnp.float32)`), and cast back afterwards"
LOSS_SCALE = "with float16 gradients use loss scaling (scale the loss up, unscale the gradients, skip steps with Inf)"
EXP_LIMIT = {"f16": 11.09, "bf16": 88.72, "f32": 88.72, "f64": 709.78}
DIVERGED = 1e6  # a value that grew to this magnitude was diverging; below, growth may be ordinary training
OVERFLOW_AT = {"f16": 65504.0, "bf16": 3.39e38, "f32": 3.40e38, "f64": 1.8e308}
DTYPE_NAMES = {"f16": "float16", "bf16": "bfloat16"}
SCALE_INPUTS = ("scale the values into range before it: normalise the inputs (pixels / 255, standardised "
                "features) and scale attention logits by 1/sqrt(head_dim) before the matmul")
UPCAST_HOW = {
    "dot_general": "`jnp.matmul(a, b, preferred_element_type=jnp.float32)` (or `a.astype(jnp.float32) @ b`)",
    "conv_general_dilated": "`lax.conv_general_dilated(..., preferred_element_type=jnp.float32)`",
    "mul": "`x.astype(jnp.float32) * x` (a norm's statistics are usually kept in float32)",
    "integer_pow": "`x.astype(jnp.float32) ** 2` (a norm's statistics are usually kept in float32)",
    "reduce_sum": "`jnp.sum(x, dtype=jnp.float32)`",
    "exp": "`jnp.exp(x.astype(jnp.float32))`",
}
EPSILON_WRITTEN = re.compile(r"\beps(ilon)?\b|\d(\.\d*)?e-\d+")  # an epsilon already in the code

POSITIVE_PARAMETER = ("keep the argument positive: map an unconstrained parameter with "
                      "`jax.nn.softplus(raw) + 1e-6` or `jnp.exp(raw)` (a ReLU or a clip reaches exactly 0)")
INVERSE_SOFTPLUS = ("clamp y first (`y = jnp.maximum(y, 1e-6)`: the inverse softplus exists only for y > 0) and "
                    "compute it stably as `y + jnp.log(-jnp.expm1(-y))`; or fit the unconstrained value directly")
SIGNED_LOGSUMEXP = ("pass `return_sign=True` (`out, sign = jax.nn.logsumexp(a, b=w, return_sign=True)`: log|sum| and "
                    "its sign), or keep the weights non-negative")
INVERTIBLE = ("keep the matrix invertible: parameterise its scales with `jnp.exp`/`jax.nn.softplus` (not a ReLU or a "
              "clip), or add a small `eps * jnp.eye(n)`")
OUT_OF_RANGE = ("check where an index past the end (or below 0) comes from: an id equal to the size of an embedding "
                "table (the vocabulary size, a special or padding token added by the tokenizer), a label of -1 for "
                "\"ignore\"; size the table for every id it is given, or map those ids in range before the lookup "
                "(`mode=\"clip\"` would hide the bug, not fix it)")
# Optax's gradient clipping rescales by max_norm / norm: an infinite gradient gives inf / inf there.
CLIPPERS = ("clip_by_global_norm", "clip_by_block_rms", "adaptive_grad_clip", "per_example_global_norm_clip")
SKIP_NONFINITE = ("fix the infinity where it is born (above): clipping cannot bound an infinite gradient; to survive "
                  "a rare one, skip that update: wrap the optimiser in `optax.apply_if_finite(tx, "
                  "max_consecutive_errors=5)`")
SUMMING = ("dot_general", "conv_general_dilated", "reduce_sum", "cumsum", "add_any")  # sum many values inside
# products summed, dense or sparse (a sparse operand is its values, its integer indices and its dense partner)
MATMULS = ("dot_general", "conv_general_dilated", "bcoo_dot_general", "bcsr_dot_general", "bcoo_spdm")


def _code(source: SourceLocation | None) -> str:
    """The code of a user line, its comment left out (``# log of the softmax`` is not a call of softmax)."""
    if source is None:
        return ""
    text = linecache.getline(source.file, source.line).strip()
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                return text[:token.start[1]].rstrip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # one line of a longer statement: the comment, if any, came before the error
    return text


def _stat(origin: Origin, i: int) -> ValueStats | None:
    return origin.inputs[i] if i < len(origin.inputs) else None


def _biggest(origin: Origin) -> float:
    values = [abs(v) for s in origin.inputs for v in (s.min, s.max) if v is not None and v == v]
    return max(values, default=0.0)


def _dtype(origin: Origin) -> str:
    stats = origin.outputs or origin.inputs
    return stats[0].dtype if stats else "f32"


def _input_pattern(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    if origin.kind != "input":
        return None
    value = "a NaN" if origin.inputs and origin.inputs[0].nan else "an Inf"
    return (f"{value} was already in argument `{origin.argument}` when `{origin.function}` was called "
            f"(call {origin.call_index}); nothing inside the function created it.",
            ["check the data that feeds this call: e.g. `assert np.isfinite(batch).all()` in the input pipeline, "
             "and find or drop the bad samples",
             "if missing values are expected, replace them before the step (`jnp.nan_to_num`, or a mask)"])


def _masked_softmax(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    first = _stat(origin, 0)
    second = _stat(origin, 1)
    if origin.primitive != "sub" or first is None or second is None or not (first.inf and second.inf):
        return None
    if second.min != float("-inf"):  # a row's maximum is -inf only when all of it is; +inf is an overflow
        return None
    rows = ""
    if second.shape and second.shape[-1] == 1 and second.max != float("inf"):  # the rows' maxima, kept dims
        rows = f" ({second.inf} of the {math.prod(second.shape)} rows)"
    return (f"a row where every entry is -inf (fully masked) was normalised{rows}: its maximum is -inf, and "
            "x - max = -inf - (-inf) = NaN.",
            ["mask with a large finite negative value instead of -inf: `jnp.finfo(x.dtype).min`",
             "pass the mask to softmax (`jax.nn.softmax(x, where=mask)`) and zero the fully masked rows "
             "afterwards: `jnp.where(mask.any(-1, keepdims=True), p, 0.0)`"])


def _masked_gradient(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    if origin.pass_ != "backward" or origin.primitive not in ("mul", "div") or origin.kind != "nan":
        return None
    zeros = [s for s in origin.inputs if s.zero]
    if not zeros or ("where" not in line and "select" not in origin.name_stack):
        return None
    return ("the forward value is masked out (by `where`), so its gradient should be 0, but the derivative "
            "of the masked branch is infinite or undefined at the masked entries and 0 * inf (or 0 / 0) gives NaN.",
            [DOUBLE_WHERE])


def _log(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    if origin.primitive not in ("log", "log1p"):
        return None
    s = _stat(origin, 0)
    limit = -1.0 if origin.primitive == "log1p" else 0.0
    if s is not None and s.min is not None and s.min < limit:
        what = f"{origin.primitive} of a negative number is NaN (smallest input {s.min:.3g})"
    else:
        what = f"{origin.primitive}({limit:g}) is -inf ({s.zero if s else 0} zero input(s))"
    code = line + "\n" + feeders
    if "softmax" in code:  # a probability that underflowed: the log-space function never does
        return what + "; its input is a softmax, which underflows to exactly 0 once the logits are far apart.", \
            [LOG_SOFTMAX, EPSILON_LOG]
    if "sigmoid" in code:
        return what + "; its input is a sigmoid, which rounds to exactly 0 (or 1) for large |x|.", \
            [LOG_SIGMOID, EPSILON_LOG]
    if "expm1" in code and s is not None and (s.negative or s.zero):  # log(expm1(y)): an inverse softplus
        return (what + "; its input is expm1(y), so y <= 0: log(expm1(y)), the inverse softplus, is undefined "
                "there.", [INVERSE_SOFTPLUS])
    exponentiated = "exp" in _log_argument(line) + "\n" + feeders  # not an exp elsewhere on its line
    return what + ".", ([LOG_SUM_EXP] if exponentiated else []) + [EPSILON_LOG]


def _normalised_zero_parameter(zero: ZeroSource) -> str | None:
    """The layer weight (Equinox/PyTorch ``.weight``, Flax ``['kernel']``: not the per-example weights of a weighted
    mean) that a division by an all-zero denominator came from, as weight normalisation divides a zero-initialised
    weight by its zero norm; None otherwise (an embedding's zero padding row under a norm is not that)."""
    divisor = _stat(zero.of, 1) if zero.of is not None and zero.of.primitive == "div" else None
    if zero.how != "argument" or divisor is None or divisor.zero < math.prod(divisor.shape):
        return None
    return next((name for name in zero.arguments if _layer_weight(name)), None)


def _layer_weight(name: str) -> bool:
    """A layer's weight by its pytree path: Equinox/PyTorch ``.weight``, Flax ``.kernel`` or ``['kernel']``."""
    return re.search(r"(\.weight|\.kernel|\['kernel'\])$", name) is not None


def _log_argument(line: str) -> str:
    """The text inside the first ``log(...)`` of a line (the whole line where its parentheses do not close)."""
    start = line.find("log(")
    if start < 0:
        return line
    depth = 0
    for end in range(start + 3, len(line)):
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        if depth == 0:
            return line[start + 4:end]
    return line


# A normalisation layer (LayerNorm, RMSNorm, GroupNorm, BatchNorm, ``self.norm1(x)``) or its statistic (a variance,
# a standard deviation, a mean of squares), on the origin's line or the lines that computed its inputs.
NORMALISES = re.compile(r"(layer|rms|group|batch|instance)_?norm|(?<!linalg)(?<!optax)\.\w*norm\w*\(|"
                        r"\b(var|std)\(|varian|mean\([^)\n]*(\*\* ?2|square)|(\*\* ?2|square\()[^\n]*\bmean\(",
                        re.IGNORECASE)
NORM_EPSILON_ZERO = ("give the normalisation a positive epsilon: `x * jax.lax.rsqrt(jnp.mean(x ** 2, -1, "
                     "keepdims=True) + 1e-6)` by hand, `nn.LayerNorm(epsilon=1e-6)`/`nn.RMSNorm(epsilon=1e-6)` in "
                     "Flax (its default), `eqx.nn.LayerNorm(shape, eps=1e-5)`: a row of zeros (a padded position, "
                     "a zero embedding) has variance 0, and only the epsilon keeps its scale finite")


def _norm_without_epsilon(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """A normalisation (LayerNorm, RMSNorm) whose epsilon is 0 (or none is added), on a row of zeros: its variance
    (mean square) is 0, and rsqrt(0) = inf (``x / sqrt(0)``: 0 / 0). A variance is never negative, so a zero
    where ``var + eps`` goes in says the epsilon is 0 there."""
    if origin.pass_ == "backward" or NORMALISES.search(line + "\n" + feeders) is None:
        return None
    if origin.primitive == "rsqrt":
        statistic, what = _stat(origin, 0), "rsqrt(0) is inf"
    elif origin.primitive == "div" and ("sqrt(" in line or "std(" in line):
        statistic, what = _stat(origin, 1), f"a division by 0 ({'0 / 0 is NaN' if origin.kind == 'nan' else 'inf'})"
    else:
        return None
    if statistic is None or not statistic.zero or statistic.negative or any(s.inf or s.nan for s in origin.inputs):
        return None
    rows = math.prod(statistic.shape[:-1]) if statistic.shape and statistic.shape[-1] == 1 else 0
    where = f"{statistic.zero} of its {rows} rows" if rows else f"{statistic.zero} place(s)"
    epsilon = ("the epsilon added to it is 0 there" + (" (float16 rounds an epsilon below 6e-8 to 0)"
                                                        if _dtype(origin) == "f16" else "")
               if EPSILON_WRITTEN.search(line) else "no epsilon (or a zero one) is added to it")
    return (f"{what}: the normalisation's variance (mean square) is 0 in {where} (rows of zeros, such as padded "
            f"positions, or of one repeated value), and {epsilon}.", [NORM_EPSILON_ZERO])


def _sqrt(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    if origin.primitive not in ("sqrt", "rsqrt", "pow") or origin.pass_ == "backward":
        return None
    s = _stat(origin, 0)
    if s is not None and s.negative:
        return (f"{origin.primitive} of a negative number is NaN (smallest input {s.min:.3g}).",
                ["clamp the input: `jnp.sqrt(jnp.maximum(x, 0.0))`, or find why it went negative (rounding in a "
                 "variance `E[x^2] - E[x]^2` is a classic)"])
    if origin.primitive == "rsqrt" and s is not None and s.zero:
        return "rsqrt(0) is inf.", [EPSILON_DIV]
    return None


def nested_derivative(origin: Origin) -> bool:
    """A forward-pass operation of a derivative the differentiated function takes itself (``jax.hessian``,
    ``jax.jacfwd``, ``jax.grad`` inside a loss, as a physics-informed loss does): its name stack holds a
    ``jvp(`` inside the outer one, or a ``transpose(``.

    Example:
        >>> nested_derivative(Origin("inf", "div", "forward", name_stack="jvp(vmap(vmap(jvp(jvp()))))"))
        True
        >>> nested_derivative(Origin("inf", "div", "forward", name_stack="jvp(vmap())"))
        False
    """
    stack = origin.name_stack
    return origin.pass_ == "forward" and (stack.count("jvp(") >= 2 or "transpose(" in stack)


def _singular_derivative(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    # A derivative nested in the forward pass is told from that function's own values only by its Inf (a tangent
    # over 0): jax.jacfwd puts the same name stack on the primal equations, where p / |p| at 0 is 0 / 0, no derivative
    nested = nested_derivative(origin) and origin.kind == "inf"
    if (origin.pass_ != "backward" and not nested) or origin.primitive not in ("div", "rsqrt", "pow", "mul",
                                                                               "integer_pow"):
        return None
    if any(s.inf for s in origin.inputs):  # inf arithmetic on values that overflowed earlier, not a singularity
        return None
    for name in ("sqrt", "norm", "pow", "**", "log", "arcsin", "arccos", "abs"):
        if name in line:
            what = {"norm": "a norm at the zero vector", "**": "a fractional power at 0"}.get(name, f"{name} at 0")
            fix = {"sqrt": SQRT_EPSILON, "norm": NORM_EPSILON, "pow": POW_BASE, "**": POW_BASE}.get(name, EPSILON_DIV)
            hints = [fix, DOUBLE_WHERE]
            made = ("this operation of a derivative the function takes itself (jax.hessian, jax.jacfwd or jax.grad "
                    "inside it) made" if nested else "this backward-pass operation made")
            return (f"the derivative of {what} is infinite, so {made} "
                    f"{'a NaN' if origin.kind == 'nan' else 'an Inf'} although the forward value is finite.", hints)
    return None


POLES = {"lgamma": "gammaln", "digamma": "digamma", "polygamma": "polygamma", "igamma": "gammainc",
         "lbeta": "betaln"}


def _pole(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """``gammaln``/``digamma`` at 0 or a negative integer (a pole): inf or NaN from a finite input, not an overflow."""
    s = _stat(origin, 0)
    if origin.primitive not in POLES or s is None or any(t.inf or t.nan for t in origin.inputs) \
            or not (s.zero or s.negative):
        return None
    name = POLES[origin.primitive]
    where = "in the gradient, " if origin.pass_ == "backward" else ""
    return (f"{where}{origin.primitive} (`jax.scipy.special.{name}`) has poles at 0 and the negative integers, where "
            f"it is {'NaN' if origin.kind == 'nan' else 'infinite'}: its input reached {s.min:.3g} "
            f"({s.zero} zero(s), {s.negative} negative).", [POSITIVE_PARAMETER])


def _nan_constant(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """A NaN written as a constant (jnp.nan) and selected: the code, or the library function called on the line
    (``jax.nn.logsumexp`` with signed weights), returns NaN on purpose."""
    if origin.kind != "nan" or not origin.constant_input or not any(s.nan for s in origin.inputs):
        return None  # (a -inf constant written for a mask is explained by what it met)
    if "logsumexp" in line:
        return ("`jax.nn.logsumexp(a, b=...)` returns NaN where sum(b * exp(a)) is negative (the log of a negative "
                "number): some weights `b` are negative and outweigh the positive ones there.", [SIGNED_LOGSUMEXP])
    return ("a NaN written as a constant (`jnp.nan`, in this line's code or inside the library function it calls) was "
            "selected into the result: the code returns NaN on purpose for these inputs.",
            ["check which condition selects the NaN (the function's documentation says when it returns NaN), and "
             "keep the inputs out of it"])


def constant_nan_note(origin: Origin) -> str:
    """What the header adds to an operation that only passed on a NaN written as a constant (the operation is
    jax's ``select_n`` inside ``jnp.where``, not the user's): who returned it; ``''`` for any other origin.

    Example:
        >>> nan = ValueStats((), "f32", float("nan"), float("nan"), 1, 0, 0, 0)
        >>> constant_nan_note(Origin("nan", "select_n", "forward", inputs=(nan,), constant_input=True))
        'passed on a NaN constant (`jnp.nan`) that the code returns on purpose'
    """
    if origin.kind != "nan" or not origin.constant_input or not any(s.nan for s in origin.inputs):
        return ""
    if "logsumexp" in _code(origin.source):
        at = f" at line {origin.source.line}" if origin.source else ""
        return f"`jax.nn.logsumexp`{at} returned its NaN constant (a negative weighted sum)"
    return "passed on a NaN constant (`jnp.nan`) that the code returns on purpose"


def _singular_matrix(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """A linear solve (a gradient of slogdet/det/inv, or solve or inv itself) on a singular matrix: NaN or Inf
    from finite inputs, as a zero pivot divides by 0 (``jnp.linalg.inv`` of a zero matrix is inf, not an
    overflow of large values)."""
    solves = ("custom_linear_solve", "triangular_solve", "lu", "lu_pivots_to_permutation")
    if origin.primitive not in solves or origin.kind not in ("nan", "inf") \
            or any(s.inf or s.nan for s in origin.inputs):
        return None
    det = next((w for w in ("slogdet", "logdet", "det", "inv") if w in line), None)
    why = (f"; the gradient of `{det}` is the inverse of the matrix, which a singular matrix does not have "
           f"(its log-determinant is -inf)" if origin.pass_ == "backward" and det in ("slogdet", "logdet", "det")
           else "")
    return (f"a linear solve with a singular matrix (a zero pivot) divides by 0{why}.", [INVERTIBLE])


def _out_of_range_gather(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """A gather that makes NaN from an operand holding none filled an index outside the array with NaN: the
    "fill" mode of ``jnp.take`` (its default) and of ``x.at[i].get(mode="fill")``; an embedding lookup given
    an id one past its table is the classic."""
    if origin.primitive != "gather" or origin.kind != "nan" or any(s.nan or s.inf for s in origin.inputs):
        return None
    table, index = _stat(origin, 0), _stat(origin, 1)
    if table is None or index is None or index.min is None or index.max is None or index.dtype[:1] not in "iu":
        return None
    return (f"an index outside the array was filled with NaN: its indices run from {index.min:g} to {index.max:g} "
            f"and the array it reads has shape {tuple(table.shape)} (`jnp.take` and `.at[i].get(mode=\"fill\")` "
            "fill what is out of range with NaN instead of raising).", [OUT_OF_RANGE])


def _degenerate_spectrum(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """The gradient of eigh/svd divides by differences of eigenvalues (singular values): equal ones, as in any
    symmetric graph or an identity-like matrix, make it infinite."""
    inside = next((p[4:-1] for p in origin.path if p in ("jit(eigh)", "jit(svd)", "jit(eig)")), None)
    if inside is None or origin.pass_ != "backward" or any(s.inf or s.nan for s in origin.inputs) \
            or not any(s.zero for s in origin.inputs):
        return None
    what = "eigenvalues" if inside != "svd" else "singular values"
    return (f"the derivative of `{inside}` divides by differences of {what} (1 / (λi - λj)); two equal (degenerate) "
            f"{what} make it infinite, though the forward values are fine.", [DEGENERATE, DEGENERATE_BASIS])


def _not_positive_definite(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """``jnp.linalg.cholesky`` of a matrix that is not (numerically) positive definite: NaN, not an error."""
    if origin.primitive != "cholesky" or origin.pass_ != "forward" or any(s.inf or s.nan for s in origin.inputs):
        return None
    return ("the Cholesky factorisation of a matrix that is not positive definite (numerically: a tiny or negative "
            "eigenvalue, or a matrix not quite symmetric) is NaN in jax, which does not raise.",
            [CHOLESKY_JITTER, "keep the parameters the matrix is built from in their valid range: fit an unconstrained "
             "value and map it (`jnp.exp`, `jax.nn.softplus`) to a positive lengthscale, variance or noise"])


def _negative_power_of_zero(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    s = _stat(origin, 0)
    if origin.kind != "inf" or origin.primitive not in ("integer_pow", "pow") or s is None or not s.zero \
            or not s.finite:
        return None
    return "a negative power of 0 is infinite (`x ** -k`, or a reciprocal written as one, at x = 0).", [EPSILON_DIV]


def _division(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    if origin.primitive not in ("div", "rem"):
        return None
    num, den = _stat(origin, 0), _stat(origin, 1)
    if den is not None and den.zero:
        both = num is not None and num.zero
        where = "in the gradient, " if origin.pass_ == "backward" else ""
        what = (f"{where}a division by zero ({den.zero} zero denominator(s))"
                f"{': 0 / 0 is NaN' if both else ' gives inf'}")
        if both and origin.pass_ == "backward" and "arctan2" in line:
            return (what + "; the derivative of arctan2(y, x) divides by x² + y², which is 0 at the origin: the angle "
                    "of the zero vector has no gradient.",
                    ["keep the points off the origin (e.g. add a tiny offset to x, or mask them out with the "
                     "double-where trick: `safe = jnp.where(r > 0, x, 1.0)`)"])
        if both and "mask" in line + "\n" + feeders:
            return (what + "; the denominator counts a mask, so nothing was unmasked there (e.g. a batch or row "
                    "of padding only).", [MASKED_MEAN, EPSILON_DIV])
        return what + ".", [EPSILON_DIV, DOUBLE_WHERE] if origin.pass_ == "backward" else [EPSILON_DIV]
    return None


def _inf_arithmetic(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    if origin.kind != "nan" or origin.primitive not in ("mul", "sub", "add", "add_any", "reduce_sum", "div", "rem",
                                                         *MATMULS):
        return None
    infs = [s for s in origin.inputs if s.inf]
    if not infs:
        return None
    if origin.primitive in ("div", "rem"):
        what = "inf / inf is NaN: both values overflowed before"
    elif origin.primitive in MATMULS and not any(  # a sparse operand's indices are no factor: floats only
            s.zero for s in origin.inputs if not s.inf and _floating(s)):  # no 0 to multiply an inf by
        what = ("inf + (-inf) inside its sum is NaN: one input holds infinities, and their products with the other "
                "input have both signs")
    elif origin.primitive in ("mul", *MATMULS):
        what = "0 * inf is NaN: one input holds inf and the other holds zeros"
    elif origin.primitive == "sub":
        what = "inf - inf is NaN: both inputs hold an infinity of the same sign"
    else:
        what = "inf + (-inf) is NaN: the inputs hold infinities of opposite sign"
    return what + " (see the chain for where the infinities came from).", _overflow_hints(origin, line)


def _floating(stats: ValueStats) -> bool:
    """Whether the statistics are of a float (or complex) array, not of integers such as a sparse index."""
    return stats.dtype.startswith(("f", "bf", "c"))


def _overflow_inside(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    """A matmul (or sum) of finite but huge values: its products or partial sums overflow, and +inf meeting
    -inf (or 0) inside it makes NaN; whether it gives NaN or only Inf depends on the order of the sums."""
    if origin.kind != "nan" or origin.primitive not in SUMMING or any(s.inf or s.nan for s in origin.inputs):
        return None
    dtype = _dtype(origin)
    limit = OVERFLOW_AT.get(dtype, 3.4e38)
    sizes = sorted((max(abs(s.min or 0.0), abs(s.max or 0.0)) for s in origin.inputs), reverse=True)
    reach = sizes[0] * sizes[1] if origin.primitive in ("dot_general", "conv_general_dilated") and len(sizes) > 1 \
        else sizes[0] if sizes else 0.0
    if reach < limit / 1e3:  # not near the dtype's range: something else made it
        return None
    inputs = " and ".join(f"{v:.3g}" for v in sizes[:2])
    loop = _iterated_product(origin)
    return (f"its inputs reach {inputs}, so its products and sums overflow {dtype} (max {limit:.3g}): inside the "
            "sum +inf meets -inf (or 0), which is NaN (on another CPU the same sum may give only Inf, and the NaN "
            "appear one operation later)." + (_iterated_sentence(loop) if loop else ""),
            [ITERATED_MATMUL] * bool(loop) + [CLIP] + ([UPCAST, LOSS_SCALE] if dtype in ("f16", "bf16") else []))


def _iterated_product(origin: Origin) -> str:
    """The loop iteration of a matmul whose inputs both grew huge inside a loop (a matrix multiplied by itself
    step after step: Newton-Schulz, matrix powers), e.g. ``scan[iteration=3]``; '' otherwise. A matmul of
    ordinary activations by weights has one large input at most.

        >>> huge = ValueStats((64, 64), "f32", -3e30, 3e30, 0, 0, 0, 2000)
        >>> _iterated_product(Origin("inf", "dot_general", "forward", path=("jit(f)", "scan[iteration=3]"),
        ...                          inputs=(huge, huge)))
        'scan[iteration=3]'
    """
    loop = next((p for p in reversed(origin.path) if p.startswith(("scan[iteration=", "while[iteration="))), "")
    if origin.primitive != "dot_general" or not loop or len(origin.inputs) < 2:
        return ""
    sizes = [max(abs(s.min or 0.0), abs(s.max or 0.0)) for s in origin.inputs[:2]]
    return loop if min(sizes) >= DIVERGED else ""


def _iterated_sentence(loop: str) -> str:
    return (f" It is inside a loop (`{loop}`) whose matmul takes the grown matrix on both sides: multiplied by "
            "itself each iteration, its entries grow geometrically.")


def _overflow_hints(origin: Origin, line: str) -> list[str]:
    """Hints for NaN made from infinities: avoid the overflow; max-subtraction only where exp is at work."""
    hints = [SUBTRACT_MAX] if any(word in line for word in ("exp", "softmax", "logsumexp", "sigmoid")) else []
    hints.append(CLIP)  # (a float16/bfloat16 origin also gets the float32 hint, from the precision check)
    return hints


def _overflow(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    if origin.kind != "inf" and origin.primitive not in ("exp", "expm1"):
        return None
    dtype = _dtype(origin)
    if origin.primitive in ("exp", "expm1", "exp2", "cosh", "sinh"):
        limit = EXP_LIMIT.get(dtype, 88.72)
        normalises = any(word in line for word in ("sum", "softmax", "logsumexp", "partition", "norm"))
        fixes = [SUBTRACT_MAX, LOG_SUM_EXP] if normalises else [BOUND_EXP, SUBTRACT_MAX]
        return (f"{origin.primitive} overflows in {dtype} for inputs above about {limit:g}; the largest input "
                f"was {_biggest(origin):.3g}.", fixes + ([UPCAST] if dtype == "f16" else []))
    if origin.primitive == "convert_element_type":
        return (f"converting to {dtype} overflowed: the value ({_biggest(origin):.3g}) is beyond {dtype}'s range "
                f"(max {OVERFLOW_AT.get(dtype, 3.4e38):.3g}).", [UPCAST, LOSS_SCALE if dtype == "f16" else CLIP])
    if not any(s.inf for s in origin.inputs):
        biggest = sorted((max(abs(s.min or 0.0), abs(s.max or 0.0)) for s in origin.inputs), reverse=True)
        what = (f"its inputs reach {biggest[0]:.3g} and {biggest[1]:.3g}, whose products" if
                origin.primitive in ("dot_general", "conv_general_dilated", "mul") and len(biggest) > 1 else
                f"its largest input is {_biggest(origin):.3g}, and the result")
        loop = _iterated_product(origin)
        return (f"{origin.primitive} overflowed {dtype}: {what} exceed {dtype}'s max "
                f"{OVERFLOW_AT.get(dtype, 3.4e38):.3g}." + (_iterated_sentence(loop) if loop else ""),
                [ITERATED_MATMUL] * bool(loop) + [CLIP] + ([UPCAST, LOSS_SCALE] if dtype in ("f16", "bf16") else []))
    return None


def _domain(origin: Origin, line: str, feeders: str) -> tuple[str, list[str]] | None:
    s = _stat(origin, 0)
    if origin.primitive not in ("acos", "asin", "atanh", "acosh") or s is None:
        return None
    return (f"{origin.primitive} is only defined on a limited range and got {s.min:.3g} .. "
            f"{s.max:.3g}.",
            ["clip the input to the valid range, e.g. `jnp.clip(x, -1 + 1e-7, 1 - 1e-7)`"])


PATTERNS: tuple[Pattern, ...] = (
    _input_pattern, _nan_constant, _masked_softmax, _masked_gradient, _log, _norm_without_epsilon, _sqrt, _pole,
    _singular_matrix, _out_of_range_gather, _degenerate_spectrum, _singular_derivative, _not_positive_definite,
    _division, _inf_arithmetic, _overflow_inside, _domain, _negative_power_of_zero, _overflow)


def _match(origin: Origin, feeders: Sequence[SourceLocation]) -> tuple[Pattern | None, str, list[str]]:
    """The first pattern that explains ``origin``: ``(pattern, sentence, hints)``, or ``(None, '', [])``."""
    line, fed = _code(origin.source), "\n".join(_code(f) for f in feeders)
    for pattern in PATTERNS:
        found = pattern(origin, line, fed)
        if found:
            return pattern, found[0], list(found[1])
    return None, "", []


def _singular(origin: Origin) -> bool:
    """Made at a 0 or outside a domain (0/0, x/0, log(0), sqrt(-1), a derivative at 0), not by overflow: growth
    of other values is no explanation for it."""
    if origin.kind == "input" or any(s.inf for s in origin.inputs):
        return False
    if origin.primitive in ("acos", "asin", "atanh", "acosh", *POLES, "custom_linear_solve", "triangular_solve"):
        return True
    first, second = _stat(origin, 0), _stat(origin, 1)
    if origin.primitive in ("div", "rem"):
        return second is not None and second.zero > 0
    if origin.primitive in ("log", "log1p", "sqrt", "rsqrt", "pow"):
        return first is not None and (first.zero > 0 or first.negative > 0)
    return False


def _overflowed(origin: Origin | None) -> bool:
    """Whether ``origin`` made an infinity from finite inputs (an overflow, not a -inf written for a mask)."""
    return (origin is not None and origin.kind == "inf" and bool(origin.inputs)
            and not any(s.inf or s.nan for s in origin.inputs))


def _growth_sentence(growth: Sequence[GrowthEntry], singular: bool) -> tuple[str, list[str], bool]:
    """``(sentence, hints, hints_first)`` for what grew before. Divergence needs a large magnitude: a bias
    leaving its 1e-6 initialisation grows 1000x by ordinary training. An origin at a 0 or outside a domain is
    not blamed on moderate growth at all."""
    top = max(growth, key=lambda g: g.ratio)
    more = f" (and {len(growth) - 1} more value(s))" if len(growth) > 1 else ""
    if top.peak >= DIVERGED:
        grew = (f"Before this, `{top.name}`{more} grew {top.ratio:.2g}x (to {top.peak:.2g}) from call "
                f"{top.first_call} on")
        if singular:
            return grew + ": the run was diverging, which may be what drove a value here to 0.", [CLIP], False
        return (grew + ": the run was diverging, and the non-finite value is where that ended, not its cause.",
                [CLIP], True)
    early = growth[0]
    grew = (f"Before this, `{early.name}`{more} grew {early.ratio:.2g}x (to {early.peak:.2g}) from call "
            f"{early.first_call} on")
    if singular:
        return grew + ".", [], False
    return grew + "; if that is unexpected, the run was starting to diverge.", [CLIP], False


def _weighted_log(first: Origin, root: Origin) -> bool:
    """``p * log(q)`` on one line, 0 * -inf where p is 0 (an entropy, a cross-entropy with 0 targets): xlogy's case."""
    here, there = first.source, root.source
    return (first.primitive == "mul" and root.primitive == "log" and here is not None and there is not None
            and (here.file, here.line) == (there.file, there.line) and any(s.zero and not s.inf for s in first.inputs))


def _where(origin: Origin) -> str:
    inner = list(origin.path[1:])
    place = f" inside {' > '.join(inner)}" if inner else ""
    src = f" at {origin.source.file.rsplit('/', 1)[-1]}:{origin.source.line}" if origin.source else ""
    value = {"nan": "A NaN", "inf": "An Inf", "input": "A non-finite value"}[origin.kind]
    if origin.kind == "input":
        return f"{value} reached `{origin.function}` in call {origin.call_index}"
    if origin.primitive is None:  # the replay did not say which operation (see the notes and warnings)
        return f"{value} is in the outputs of `{origin.function}`, call {origin.call_index}{src}"
    pass_ = "backward pass (the gradient)" if origin.pass_ == "backward" else "forward pass"
    eager = " (run eagerly, outside jit)" if origin.path[:1] == ("eager",) else ""
    if origin.transformed_by:  # its path's head names the transformation; "inside" names what is inside it
        eager = f" (through `{origin.transformed_by}`, applied outside jit)"
    return (f"{value} was first made by `{origin.primitive}` in the {pass_} of `{origin.function}`, "
            f"call {origin.call_index}{eager}{place}{src}")


def _root_where(root: Origin, first: Origin) -> str:
    pass_ = "backward pass" if root.pass_ == "backward" else "forward pass"
    line = f" at line {root.source.line}" if root.source else ""
    call = ("" if (root.function, root.call_index) == (first.function, first.call_index)
            else f" of `{root.function}`, call {root.call_index}")
    inner = f" inside {' > '.join(root.path[1:])}" if root.path[1:] and root.path[:1] != ("eager",) else ""
    return f"The infinity came from `{root.primitive}` in the {pass_}{call}{inner}{line}"


def _range_sentence(overflow: Overflow, first: Origin) -> str:
    """The root cause, a bf16/f16 overflow before the origin: where the value left the dtype's range."""
    o, name = overflow.origin, DTYPE_NAMES[overflow.dtype]
    pass_ = "backward pass" if o.pass_ == "backward" else "forward pass"
    call = ("" if (o.function, o.call_index) == (first.function, first.call_index)
            else f" of `{o.function}`, call {o.call_index}")
    line = f" at line {o.source.line}" if o.source else ""
    reach = f"; products of its inputs reach {overflow.reach:.3g}" if overflow.reach else ""
    if overflow.reach and overflow.reach < overflow.max and o.primitive in SUMMING:  # no one product leaves the range
        reach = (f"; each product of its inputs, at most {overflow.reach:.3g}, stays within it: the sum over the "
                 "contracted dimension is what overflowed")
    return (f"The root cause is a {name} overflow: `{o.primitive}` in the {pass_}{call}{line} computed values beyond "
            f"{name}'s range (max {overflow.max:.6g}{reach}) and made Inf, which later operations turned into "
            f"this {'NaN' if first.kind == 'nan' else 'Inf'}; an epsilon does not help.")


def _zero_sentence(zero: ZeroSource, first: Origin, grown: Sequence[str] = ()) -> str:
    """Where the zero the origin (or the division behind its infinity, ``zero.of``) divided by (or took the log of)
    was made (:mod:`jaxdbg.nan.zero_source`); of the arguments it is computed from, those that grew before it
    (``grown``) are named first: the likelier cause."""
    divided = zero.of or first
    what = "The zero denominator" if divided.primitive in ("div", "rem") else "The zero"
    named = sorted(zero.arguments, key=lambda name: name not in grown)  # stable: the call's order otherwise
    args = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    if zero.how == "outside":
        if divided.path[-1].startswith(("while[", "scan[")):
            return f"{what} came in with the loop's carry, from an earlier iteration than `{divided.path[-1]}`."
        return f"{what} was computed before `{divided.path[-1]}` began" + (f", from {args}." if args else ".")
    if zero.how == "literal":
        written = f" (`{zero.name}`)" if zero.name else ""
        return (f"{what} is a 0 written into the traced code{written}: a Python number (a config value, a global) that "
                f"`{first.function}` read when it was traced, so it is a constant of the compiled function.")
    if zero.how == "captured":
        array = f"`{zero.name}`, an array" if zero.name else "an array"
        at = f": its element {list(zero.index)} is 0" if zero.index else ""
        return (f"{what} comes from {array} that `{first.function}` captured (a global or a closure, not an argument, "
                f"so it is a constant of the compiled function){at}.")
    if zero.primitive is None:
        return f"{what} came in with the argument {args}." if args else f"{what} came in from outside this computation."
    line = f" at line {zero.source.line}" if zero.source else ""
    ranges = ", ".join(_range_of(s) for s in zero.inputs)
    nonzero = "" if any(s.zero for s in zero.inputs) else ", non-zero"  # exp's input is 0 at a softmax's maximum
    how = {"underflow": f": its result underflowed to 0 from finite{nonzero} inputs ({ranges})"
                        + (", as a softmax does once the logits are far apart" if _softmax_underflow(zero) else ""),
           "cancellation": ": it cancelled to 0 " + ("from inputs that hold no zero" if nonzero else
                                                     "where none of its inputs is 0") + f" ({ranges})",
           "empty": f" (a `segment_sum` or `.at[...].add`): {zero.zeros} of its {zero.size} entries had nothing added "
                    "(no index points at them: an empty segment, a node with no edges), so they kept their initial 0",
           }.get(zero.how, "")
    return f"{what} was made by `{zero.primitive}`{line}{how}" + (f"; it is computed from {args}." if args else ".")


def _vmap_sentence(first: Origin) -> str:
    """Under vmap: whether every batch element is affected (each output entry non-finite) or only some."""
    out = first.outputs[0] if first.outputs else None
    if out is not None and out.nan + out.inf == math.prod(out.shape):
        return "It runs under vmap, and every batch element is affected (every entry of its result)."
    return "It runs under vmap: only some batch elements are affected (see the input statistics)."


def _softmax_underflow(zero: ZeroSource) -> bool:
    """The zero is an ``exp`` of a softmax (its line calls one) that underflowed."""
    return zero.how == "underflow" and zero.primitive == "exp" and "softmax" in _code(zero.source)


def _divided_by_log(zero: ZeroSource, first: Origin) -> bool:
    """The zero went into a log (the origin's, or the one behind its infinity): log-space functions avoid it."""
    return ((zero.of or first).primitive or "") in ("log", "log1p")


def _normalises_exponentials(first: Origin, zero: ZeroSource) -> bool:
    """Whether a division's zero denominator is a sum of exponentials that all underflowed: ``p / p.sum()`` with
    ``p`` from ``exp`` (a softmax written out, EM's responsibilities, attention weights normalised by hand)."""
    if first.primitive != "div" or zero.primitive not in ("exp", "exp2"):
        return False
    line = _code(first.source)
    return "sum(" in line or "sum (" in line


def _cond_select_sentence(select: CondSelect) -> str:
    """Whether the select a cond became under vmap kept the origin's NaN (:mod:`jaxdbg.nan.cond_select`)."""
    line = f" at line {select.source.line}" if select.source else ""
    cond, every = ("`lax.cond`", "both branches") if select.branches == 2 else \
        ("`lax.switch`", f"all {select.branches} branches")
    turned = (f"Under vmap, jax turned the {cond}{line} into a select: it computes {every} for every batch element "
              "and keeps one result per element.")
    if select.kept:
        also = f"; {select.discarded} more in results it discarded" if select.discarded else ""
        return (f"{turned} This NaN is in a result that was selected ({select.kept} value(s){also}): the branch makes "
                "it for an element that takes the branch, so it is the branch's own NaN, not the discarded result of "
                "an element that takes another branch.")
    return (f"{turned} This NaN is born in the branch whose result was not selected (its {select.discarded} NaN "
            "value(s) sit where another branch was taken): the select throws it away, and jax keeps it out of the "
            "gradient too, so it is not what made the outputs non-finite; it is only the first NaN made.")


def _reaching_sentence(discarded: Sequence[Discarded], reaching: Origin | None, said: bool) -> str:
    """The origin's NaN reaches no output (``said``: the cond's sentence said how already): the NaN that does."""
    how = "" if said else f"This NaN reaches no output: it was made {discarded[0].how()}. "
    more = (f" ({len(discarded) - 1} more NaN(s) made before it reach no output either)"
            if len(discarded) > 1 else "")
    if reaching is None:
        return how.strip()
    at = f" at line {reaching.source.line}" if reaching.source else ""
    if discarded and reaching.path[1:] and reaching.path != discarded[0].origin.path:  # a while's body, not its cond
        at += f" inside {' > '.join(reaching.path[1:])}"
    return (f"{how}The NaN in the outputs is made later, by `{reaching.primitive}`{at} in the {reaching.pass_} "
            f"pass{more}: that is the one to fix.")


def _masked_sentence(select: CondSelect) -> str:
    """The origin's NaN was discarded by a select (a ``jnp.where``) yet reaches the outputs: through its gradient."""
    at = f" at line {select.source.line}" if select.source else ""
    return (f"The select{at} (e.g. a `jnp.where`) discards this NaN from the forward values, yet it still reaches the "
            "outputs: the gradient sends a zero cotangent to the discarded entries, the derivative of the operation "
            "there is NaN or infinite, and 0 * NaN is NaN (a single where does not keep a NaN out of the gradient).")


def _range_of(stats: ValueStats) -> str:
    if stats.min is None or stats.max is None:
        return stats.dtype
    return f"{stats.min:.4g}" if stats.min == stats.max else f"{stats.min:.4g} to {stats.max:.4g}"


def _range_fixes(overflow: Overflow) -> list[str]:
    """Fixes for a bf16/f16 overflow: that operation in float32, its inputs scaled, loss scaling for a gradient."""
    o = overflow.origin
    line = f" at line {o.source.line}" if o.source else ""
    how = UPCAST_HOW.get(o.primitive or "", "cast its inputs with `.astype(jnp.float32)`")
    fixes = [f"compute `{o.primitive}`{line} in float32: {how}, and cast the result back if needed", SCALE_INPUTS]
    return [LOSS_SCALE, *fixes] if o.pass_ == "backward" else fixes


def _has_epsilon(origin: Origin) -> bool:
    """The origin's line already adds an epsilon (``+ eps``, ``1e-5``): another one is no fix."""
    return EPSILON_WRITTEN.search(_code(origin.source)) is not None


def explain(first: Origin | None, chain: Sequence[Origin] = (), growth: Sequence[GrowthEntry] = (),
            precision: PrecisionCheck | None = None, strategy: Strategy | None = None,
            input_sources: Mapping[Origin, Sequence[SourceLocation]] | None = None,
            overflow: Overflow | None = None, zero: ZeroSource | None = None,
            cond_select: CondSelect | None = None, discarded: Sequence[Discarded] = (),
            reaching: Origin | None = None, trains: bool | str = True,
            clipper: str | None = None) -> tuple[str, tuple[str, ...]]:
    """``(paragraph, hints)`` for a finding; an empty paragraph when nothing was found.

    ``input_sources`` gives, per origin, the user lines that computed its inputs (from the replay);
    ``overflow``, a bf16/f16 overflow behind the origin (:mod:`jaxdbg.nan.overflow`): the root cause and its fix;
    ``zero``, where the zero the origin divided by was made (:mod:`jaxdbg.nan.zero_source`); ``cond_select``,
    the select a cond became under vmap, which kept or discarded the origin's NaN, or a select that discarded it
    from the values of a differentiated forward pass (:mod:`jaxdbg.nan.cond_select`); ``discarded``, when the
    origin's NaN reaches no output, it and the NaNs after it that reach none either
    (:class:`jaxdbg.nan.localise.Discarded`), and ``reaching``, the first NaN that does. ``trains``: the call
    computes a gradient (otherwise no hint speaks of gradients or learning rates; ``"in loops"``: only inside loop
    bodies, where a step size is named too). ``clipper``: the Optax clipping transformation the origin's operation
    ran in (its NaN is the rescaling of an infinite gradient: advising to clip is no fix).
    """
    if first is None:
        return "", ()
    sources = input_sources or {}
    pattern, text, hints = _match(first, sources.get(first, ()))
    if pattern is _masked_softmax and _overflowed(inf_root(first, chain)):  # the -inf overflowed: no mask made it
        pattern, (text, hints) = _inf_arithmetic, _inf_arithmetic(first, _code(first.source), "") or ("", [])
    parts = [_where(first) + ":", text or (
        f"`{first.primitive}` produced it from inputs that held no {'NaN' if first.kind == 'nan' else 'Inf'}."
        if first.primitive is not None else "which operation made it inside the call is not known.")]
    # a NaN made from infinities is explained by where they were born: by arithmetic on them, or by a function
    # outside its domain there (log(-inf) of an ODE that blew up is the blow-up's, not the log's)
    fed_inf = pattern in (_log, _sqrt, _domain) and any(s.inf for s in first.inputs)
    root = inf_root(first, chain) if pattern in (_inf_arithmetic, None) or fed_inf else None
    root_pattern, root_text, root_hints = _match(root, sources.get(root, ())) if root is not None else (None, "", [])
    if overflow is not None:  # where the value left its dtype's range: that is what to fix
        if overflow.origin != first:
            parts.append(_range_sentence(overflow, first))
            root = overflow.origin
        hints = _range_fixes(overflow)
    elif root is not None and root_pattern is not None:
        parts.append(f"{_root_where(root, first)}: {root_text[0].lower()}{root_text[1:]}")
        hints = root_hints  # fix where the infinity is born; the arithmetic on it only passes it on
    else:
        root = None
    if zero is not None:
        parts.append(_zero_sentence(zero, first, [entry.name for entry in growth]))
        if _softmax_underflow(zero) and _divided_by_log(zero, first):
            hints = [LOG_SOFTMAX, *(h for h in hints if h != LOG_SOFTMAX)]
        elif zero.how == "underflow" and _normalises_exponentials(first, zero):
            parts.append("Every term of the sum it divides by underflowed: exponentials divided by their own sum are a "
                         "softmax written out, which works in linear space and reaches 0/0 once every exponent is far "
                         "below 0.")
            hints = [LOG_NORMALISE, *hints]
        elif zero.how == "underflow":
            hints = [UNDERFLOW, *hints]
        elif zero.how == "empty":
            hints = [EMPTY_SEGMENT, *hints]
        elif zero.how == "literal":
            hints = [LITERAL_ZERO.format(name=f"`{zero.name}`" if zero.name else "the Python number divided by"),
                     *hints]
        elif zero.how == "captured":
            hints = [CAPTURED_ZERO.format(name=f"`{zero.name}`" if zero.name else "the captured array"), *hints]
        elif zero.how == "argument" and "one_hot(" in "\n".join(_code(f) for f in sources.get(first, ())):
            hints = [ONE_HOT_RANGE, *hints]
        elif _normalised_zero_parameter(zero):
            hints = [ZERO_PARAMETER.format(name=_normalised_zero_parameter(zero)), *hints]
        elif zero.how == "argument" and any("weight" in name.lower() and not _layer_weight(name)
                                            for name in zero.arguments):
            hints = [WEIGHTED_MEAN, *hints]
    if root is not None and _weighted_log(first, root):  # the zero weight is no bug: the product must be 0 there
        # after the fix of a log that should never have seen a 0 (of a sigmoid, a softmax), first otherwise
        after = max((i + 1 for i, h in enumerate(hints) if h in (LOG_SIGMOID, LOG_SOFTMAX)), default=0)
        hints = [*hints[:after], XLOGY, *hints[after:]]
    if "custom_vjp_bwd(" in " ".join(first.path):
        rule = next(p for p in first.path if p.startswith("custom_vjp_bwd("))[15:-1]
        parts.append(f"This happens inside your own custom_vjp backward rule `{rule}` (the line shown is in it).")
        hints = [f"guard the operation in `{rule}`: e.g. `jnp.where(n > 0, g * x / n, 0.0)` with a safe "
                 "denominator, or divide by `jnp.maximum(n, eps)`"] + [h for h in hints if h != DOUBLE_WHERE]
    if cond_select is not None and not cond_select.cond:  # a jnp.where masked it, yet its gradient did not
        parts.append(_masked_sentence(cond_select))
        hints = [DOUBLE_WHERE] + [h for h in hints if h != DOUBLE_WHERE]
    elif cond_select is not None:
        parts.append(_cond_select_sentence(cond_select))
        if not cond_select.kept:  # a NaN nobody sees: the fix that matters is to stop it hiding the real one
            hints = [UNTAKEN_BRANCH] + [h for h in hints if h != DOUBLE_WHERE]
    elif "vmap" in first.path:
        parts.append(_vmap_sentence(first))
    if discarded:
        said = cond_select is not None and cond_select.cond and not cond_select.kept
        parts.append(_reaching_sentence(discarded, reaching, said))
    for origin in chain:
        if origin.constant_input:
            parts.append(f"The infinity fed into it was written in the code as a constant (`{origin.primitive}` at "
                         f"line {origin.source.line if origin.source else '?'}).")
            break
    else:
        if chain and root is None and chain[0].primitive is None:  # an argument held it when the call began
            parts.append(f"Its infinite inputs came in through the argument `{chain[0].argument}` of "
                         f"`{chain[0].function or first.function}`, already infinite when the call began.")
        elif chain and root is None:
            src = chain[0].source
            parts.append(f"Its infinite inputs came from `{chain[0].primitive}`"
                         f"{f' at line {src.line}' if src else ''} (see chain).")
    clipped = clipper is not None and first.kind == "nan" and any(s.inf for s in first.inputs)
    if clipped:
        parts.append(f"It is made inside `optax.{clipper}`: the gradient's norm is infinite, and scaling the gradient "
                     "by max_norm / norm gives inf / inf (and inf * 0) there.")
    if growth:
        sentence, growth_hints, urgent = _growth_sentence(growth, _singular(root or first))
        parts.append(sentence)
        hints = growth_hints + hints if urgent else hints + growth_hints
    if precision is not None:
        parts.append(precision.detail[0].upper() + precision.detail[1:] + ".")
        if precision.f32_removes_origin:
            hints.insert(0, UPCAST)
    elif overflow is None and first.kind != "input" and _dtype(first) in ("bf16", "f16"):
        hints.append(UPCAST + " (run with --precision to test whether float32 fixes it)")
        if _dtype(first) == "f16":
            hints.append(LOSS_SCALE)
    if strategy == "compiled-prefix bisection":
        parts.append("Replayed one operation at a time the values stay finite; only the compiled program (XLA "
                     "fuses and rewrites algebra, e.g. (y + c) - c becomes y) produces it, so jaxdbg bisected "
                     "over compiled prefixes of the computation.")
    if _has_epsilon(first):
        hints = [h for h in hints if h not in EPSILONS]
    if ITERATED_MATMUL in hints:  # the cause, before the growth's generic advice
        hints = [ITERATED_MATMUL, *(h for h in hints if h != ITERATED_MATMUL)]
    if clipped:
        hints = [h for h in hints if h != CLIP] + [SKIP_NONFINITE]
    if not trains:
        hints = [BOUND if h == CLIP else h for h in hints if h != LOSS_SCALE]
    elif trains == "in loops":
        hints = [CLIP_OR_STEP if h == CLIP else h for h in hints]
    return " ".join(parts), tuple(dict.fromkeys(hints))


def analyse(findings: Findings) -> None:
    """The ``explanation`` analysis: the paragraph and hints, from everything found before it."""
    findings.explanation, findings.hints = explain(findings.first, findings.chain, findings.growth,
                                                   findings.precision, findings.strategy, findings.sources,
                                                   findings.overflow, findings.zero_source, findings.cond_select,
                                                   getattr(findings.localisation, "discarded", ()),
                                                   getattr(findings.localisation, "reaching", None),
                                                   _trains(findings.localisation), _clipper(findings.localisation))
    if findings.first is not None and findings.first.kind == "input" and not getattr(findings.watch, "eager", True):
        findings.hints = (*findings.hints, UNCHECKED_EAGER)
    if findings.first is None or findings.first.kind == "input":
        return
    curves = _schedules(findings)
    # A count-driven multiplier that changes sign is a schedule gone negative where it scales a gradient step and
    # values grew (elsewhere it may be data: a sinusoid of a time step); a negative rate in `p - lr * g` always is.
    diverged = bool(findings.growth) and _trains(findings.localisation) is not False
    flip = (schedule.sign_flip(curves) if diverged else None) or _negative_step(findings)
    if flip is not None:  # the updates climb the loss
        findings.explanation += " " + flip.sentence(bool(findings.growth))
        rest = (h for h in findings.hints if h != CLIP)
        findings.hints = (flip.hint(), *rest) if findings.growth else (*rest, flip.hint())
    warmed = schedule.warmup(curves) if CLIP in findings.hints else None
    if warmed is not None:  # "add warmup" is no advice where the step already warms its learning rate up
        findings.hints = tuple(dict.fromkeys(warmed.hint() if h == CLIP else h for h in findings.hints))


def _negative_step(findings: Findings) -> schedule.NegativeStep | None:
    """A learning rate passed to the failing call as a negative argument (:func:`schedule.negative_step`)."""
    jaxpr = getattr(findings.localisation, "closed_jaxpr", None)
    if jaxpr is None or findings.call is None:
        return None
    try:
        return schedule.negative_step(jaxpr, findings.call.leaves(), findings.call.leaf_names())
    except Exception:  # noqa: BLE001 - a refinement of the hints: its failure must not cost the explanation
        return None


def _schedules(findings: Findings) -> list[schedule.Curve]:
    """The learning-rate schedules the failing call follows (:func:`schedule.curves`), read from its jaxpr and
    arguments; none also where reading them fails (the hints then stay the general ones)."""
    jaxpr = getattr(findings.localisation, "closed_jaxpr", None)
    if jaxpr is None or findings.call is None:
        return []
    try:
        return schedule.curves(jaxpr, findings.call.leaves())
    except Exception:  # noqa: BLE001 - a refinement of the hints: its failure must not cost the explanation
        return []


# jaxdbg.watch checks jitted calls only: a NaN an eager jax.grad made comes to it as an argument of the next call.
UNCHECKED_EAGER = ("if that argument is computed outside jit (`jax.grad` or an optimiser update applied eagerly), "
                   "jaxdbg.watch does not check those operations: run the script under `jaxdbg nan-hunt`, which "
                   "checks operations outside jit too and names the one that made it")


def _clipper(localisation: Any) -> str | None:
    """The Optax clipping transformation (``clip_by_global_norm``) the origin's operation was traced in, if any."""
    site = getattr(getattr(localisation, "record", None), "site", None)
    callers = _compat.eqn_callers(site.eqn) if site is not None else ()
    return next((name.split(".")[0] for name in callers if name.split(".")[0] in CLIPPERS), None)


def _trains(localisation: Any) -> bool | str:
    """Whether the replayed call computes a gradient (unknown, as for an operation outside jit: assumed), and
    ``"in loops"`` where it does only inside loop bodies (a sampler's integrator)."""
    jaxpr = getattr(localisation, "closed_jaxpr", None)
    if jaxpr is None:
        return True
    return "in loops" if passes.differentiates_only_in_loops(jaxpr) else passes.differentiates(jaxpr)
