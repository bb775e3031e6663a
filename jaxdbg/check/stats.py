"""Is a figure slower than its baseline beyond the noise? Numpy-only tests on the ratio of medians.

:func:`median_ratio_test` is a one-sided permutation test (are the current samples slower than the
baseline's, under the null hypothesis that both come from one distribution?) with a bootstrap interval of
the ratio of medians. Both resample with a fixed seed, so one pair of sample sets always gets one answer.

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


def run_to_run_noise(run_medians: Sequence[float]) -> float:
    """How far apart repeated runs of one program land: the largest over the smallest of their medians
    (1.0 for a single run: no noise was measured).

    Example:
        >>> run_to_run_noise([1.0, 1.1, 0.95]), run_to_run_noise([2.0])
        (1.1578947368421053, 1.0)
    """
    values = [v for v in run_medians if v > 0]
    return max(values) / min(values) if len(values) > 1 else 1.0
