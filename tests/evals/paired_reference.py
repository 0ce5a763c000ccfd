"""Plain references for the paired yes/no statistics, written from the papers' definitions with
other algorithms than :mod:`evalkit.evals.paired_binary` uses, for the tests to hold it against.

- Tango's score interval by brute force: the restricted maximum-likelihood estimate found by numeric
  maximisation of the multinomial likelihood (not the closed-form quadratic root), the score statistic
  from it, and each bound by bisection of ``|Z(d)| = z``;
- the design effect (Rao-Scott) of a share and of a paired change, with loops over items;
- the sign-flip test over items by a dictionary of sums, one item at a time.
"""

from __future__ import annotations

import math

from scipy import optimize, stats

Z = 1.959963984540054


def restricted_score(b: float, c: float, n: float, d: float) -> float:
    """Z(d) of H0: p(c) - p(b) = d, with p(b) maximising the likelihood under H0 numerically."""
    m = n - b - c

    def nll(q: float) -> float:
        cells = ((b, q), (c, q + d), (m, 1 - 2 * q - d))
        if any(p <= 0 for count, p in cells if count > 0):
            return 1e300
        return -sum(count * math.log(p) for count, p in cells if count > 0)

    lo, hi = max(0.0, -d) + 1e-15, (1 - d) / 2 - 1e-15
    q = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-14}).x
    if b == 0 and nll(lo) <= nll(q):
        q = max(0.0, -d)  # the maximum on the boundary
    var = n * (2 * q + d * (1 - d))
    return (c - b - n * d) / math.sqrt(var) if var > 0 else math.copysign(math.inf, c - b - n * d)


def tango_brute(b: float, c: float, n: float, z: float = Z) -> tuple[float, float]:
    """Tango's 95 % interval of (c - b) / n by bisection of the brute-force score statistic."""
    point = (c - b) / n

    def bisect(lo: float, hi: float, inside_below: bool) -> float:
        for _ in range(60):
            mid = (lo + hi) / 2
            inside = abs(restricted_score(b, c, n, mid)) < z
            if inside == inside_below:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    edge = 1 - 1e-9
    low = -1.0 if abs(restricted_score(b, c, n, -edge)) < z else bisect(-edge, point, False)
    high = 1.0 if abs(restricted_score(b, c, n, edge)) < z else bisect(point, edge, True)
    return low, high


def wilson(x: float, n: float, z: float = Z) -> tuple[float, float]:
    centre = (x + z * z / 2) / (n + z * z)
    half = z * math.sqrt(x * (n - x) / n + z * z / 4) / (n + z * z)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def share_design_effect(rows: list[list[float]]) -> float:
    """Rao-Scott design effect of the share of 1s over items (rows) x samples, held to [1, k]."""
    n, k = len(rows), len(rows[0])
    if k == 1:
        return 1.0
    total = sum(sum(r) for r in rows)
    p = total / (n * k)
    srs = p * (1 - p) / (n * k)
    if srs == 0:
        return float(k)
    between = sum((sum(r) - k * p) ** 2 for r in rows) * n / (n - 1) / (n * k) ** 2
    return min(max(between / srs, 1.0), float(k))


def change_design_effect(base: list[list[float]], other: list[list[float]]) -> float:
    """Rao-Scott design effect of the mean paired change other - base, held to [1, k]."""
    n, k = len(base), len(base[0])
    if k == 1:
        return 1.0
    d = [[o - b for b, o in zip(br, orow)] for br, orow in zip(base, other)]
    big_n = n * k
    delta = sum(map(sum, d)) / big_n
    srs = (sum(abs(x) for r in d for x in r) / big_n - delta**2) / big_n
    if srs <= 0:
        return float(k)
    between = sum((sum(r) - k * delta) ** 2 for r in d) * n / (n - 1) / big_n**2
    return min(max(between / srs, 1.0), float(k))


def cluster_z(n: int, k: int) -> float:
    """The quantile of the clustered intervals: Student's with n - 1 df over n items of k > 1 samples."""
    return Z if k == 1 else float(stats.t.ppf(0.975, n - 1))


def clustered_change_interval(base: list[list[float]], other: list[list[float]]) -> tuple[float, float]:
    deff = change_design_effect(base, other)
    b = sum(x == 1 and y == 0 for br, r in zip(base, other) for x, y in zip(br, r))
    c = sum(x == 0 and y == 1 for br, r in zip(base, other) for x, y in zip(br, r))
    n, k = len(base), len(base[0])
    return tango_brute(b / deff, c / deff, n * k / deff, cluster_z(n, k))


def sign_flip_p(changes: list[int]) -> float:
    """Exact two-sided p of sum(changes) under independent fair signs of each |change|."""
    dist = {0: 1.0}
    for a in changes:
        nxt: dict[int, float] = {}
        for s, p in dist.items():
            for t in {s + abs(a), s - abs(a)}:
                nxt[t] = nxt.get(t, 0.0) + p / (2 if a else 1)
        dist = nxt
    observed = abs(sum(changes))
    return min(1.0, sum(p for s, p in dist.items() if abs(s) >= observed))
