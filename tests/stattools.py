"""Goodness-of-fit helpers for the exactness tests (no scipy needed)."""

import math

import numpy as np


def chi2_critical(df: int, alpha: float = 1e-3) -> float:
    """Upper critical value of chi-square (Wilson-Hilferty approximation)."""
    z = {1e-3: 3.0902, 1e-4: 3.7190, 1e-2: 2.3263}[alpha]
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square of observed counts against probabilities; bins with expected < 5 are pooled."""
    n = counts.sum()
    expected = probs * n
    if (counts[expected == 0] > 0).any():
        return math.inf, 1  # a sample where the law says probability zero
    big = expected >= 5
    obs = list(counts[big]) + [counts[~big].sum()]
    exp = list(expected[big]) + [expected[~big].sum()]
    pairs = [(o, e) for o, e in zip(obs, exp) if e > 0]
    stat = sum((o - e) ** 2 / e for o, e in pairs)
    return stat, max(len(pairs) - 1, 1)


def fits(counts, probs, alpha: float = 1e-3) -> bool:
    stat, df = chi2_stat(np.asarray(counts, dtype=float), np.asarray(probs, dtype=float))
    return stat < chi2_critical(df, alpha)


def tv(counts, probs) -> float:
    counts = np.asarray(counts, dtype=float)
    return 0.5 * np.abs(counts / counts.sum() - np.asarray(probs)).sum()


def same(a, b, alpha: float = 1e-3) -> bool:
    """Two samples from one distribution? Pearson chi-square of the 2 x K table (bins with a pooled expected count
    under 5 in either sample are pooled)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    pooled = (a + b) / (a.sum() + b.sum())
    big = (pooled * min(a.sum(), b.sum())) >= 5
    table = [np.append(x[big], x[~big].sum()) for x in (a, b)]
    table = np.array(table)[:, np.array(table).sum(0) > 0]
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    return stat < chi2_critical(max(table.shape[1] - 1, 1), alpha)


def fit_two(first, second, p1, p2) -> tuple[bool, bool]:
    """Whether the first and the second tokens drawn fit their exact distributions P1 and P2 (chi-square each)."""
    return fits(np.bincount(first, minlength=len(p1)), p1), fits(np.bincount(second, minlength=len(p1)), p2)
