"""Is a figure slower than its baseline beyond the noise? Numpy-only tests.

Two kinds of noise: between the calls of one run (timed calls jitter) and between runs (another moment, other
load on the machine, another process layout). :func:`run_level_test` holds the runs' medians against the
spread of the baseline's repeated runs (a one-sided Student t prediction test on their logarithms): the test a
regression must pass. :func:`median_ratio_test` (a one-sided permutation test on the calls' times, with a
bootstrap interval of the ratio of medians) measures the change and, with a single baseline run, is the only
test there is. Resampling uses a fixed seed, so one pair of sample sets always gets one answer.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> base = 1.0 + 0.05 * rng.standard_normal(20)
    >>> ratio, p, (low, high) = median_ratio_test(base, 2.0 * (1.0 + 0.05 * rng.standard_normal(20)))
    >>> round(ratio, 1), p < 0.01, low > 1.5
    (2.0, True, True)
    >>> median_ratio_test(base, base[::-1])[1] > 0.4      # the same samples: no evidence of a slowdown
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 4000


def median_ratio_test(baseline: Sequence[float], current: Sequence[float], confidence: float = 0.99,
                      resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, tuple[float, float]]:
    """(ratio of medians current/baseline, one-sided permutation p-value, bootstrap interval of the ratio)."""
    base = np.asarray(baseline, dtype=float)
    now = np.asarray(current, dtype=float)
    observed = float(np.median(now) / np.median(base))
    rng = np.random.default_rng(seed)
    pooled = np.concatenate([base, now])
    shuffled = rng.permuted(np.broadcast_to(pooled, (resamples, pooled.size)), axis=1)
    permuted = np.median(shuffled[:, base.size:], axis=1) / np.median(shuffled[:, :base.size], axis=1)
    # The +1s count the observed split itself: a permutation p-value is never 0.
    p_value = float((1 + np.count_nonzero(permuted >= observed * (1 - 1e-12))) / (resamples + 1))
    base_boot = np.median(rng.choice(base, (resamples, base.size)), axis=1)
    now_boot = np.median(rng.choice(now, (resamples, now.size)), axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(now_boot / base_boot, [tail, 1 - tail])
    return observed, p_value, (float(low), float(high))


def run_level_test(baseline_runs: Sequence[float], current_runs: Sequence[float],
                   alpha: float) -> tuple[float, float]:
    """(one-sided p-value, noise bound) of the current runs' medians against the baseline runs' medians.

    On logarithms: t = (mean now - mean baseline) / (s * sqrt(1/k + 1/m)), with s the baseline runs' standard
    deviation (k runs, k - 1 degrees of freedom) and m current runs. The noise bound is the ratio a rerun of
    the same program stays under with probability 1 - alpha. Needs k >= 2 baseline runs.

    Example:
        >>> p, bound = run_level_test([1.0, 1.05, 0.97, 1.02], [1.03], alpha=0.01)
        >>> p > 0.1, 1.05 < bound < 1.5
        (True, True)
        >>> run_level_test([1.0, 1.05, 0.97, 1.02], [2.0], alpha=0.01)[0] < 0.01
        True
    """
    base = np.log(np.asarray(baseline_runs, dtype=float))
    now = np.log(np.asarray(current_runs, dtype=float))
    k, m = base.size, now.size
    spread = float(np.std(base, ddof=1)) * math.sqrt(1 / k + 1 / m)
    spread = max(spread, 1e-9)  # identical runs: any slowdown is beyond them, none is a division by zero
    t = (float(now.mean()) - float(base.mean())) / spread
    dof = k - 1
    return student_t_sf(t, dof), math.exp(student_t_quantile(1 - alpha, dof) * spread)


def _t_grid(dof: int) -> tuple[np.ndarray, np.ndarray]:
    """The Student t CDF on a grid of x >= 0 (integrated numerically: no scipy)."""
    x = np.linspace(0.0, 400.0, 400_001) if dof < 3 else np.linspace(0.0, 60.0, 120_001)
    log_norm = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    pdf = np.exp(log_norm - (dof + 1) / 2 * np.log1p(x * x / dof))
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(x))])
    return x, cdf


def student_t_sf(t: float, dof: int) -> float:
    """P(T > t) for Student's t with ``dof`` degrees of freedom.

    Example:
        >>> round(student_t_sf(0.0, 3), 3), round(student_t_sf(4.541, 3), 4)   # t(0.99, 3) = 4.541
        (0.5, 0.01)
    """
    x, cdf = _t_grid(dof)
    upper = float(np.interp(abs(t), x, cdf))
    return 1.0 - upper if t >= 0 else upper


def student_t_quantile(q: float, dof: int) -> float:
    """The q-quantile (q >= 0.5) of Student's t.

    Example:
        >>> round(student_t_quantile(0.99, 2), 2), round(student_t_quantile(0.975, 10), 3)
        (6.96, 2.228)
    """
    x, cdf = _t_grid(dof)
    return float(np.interp(q, cdf, x))
