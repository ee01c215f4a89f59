"""Confidence bounds for means of bounded observations.

:func:`mixture_radius`: an anytime-valid confidence sequence (valid at every number of
observations at once, so it may be read after every answer, however late) from Robbins' normal
mixture of the sub-Gaussian exponential supermartingales ``exp(lambda S_t - lambda^2 v_t / 2)``
(Howard, Ramdas, McAuliffe & Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence
sequences", Ann. Statist. 2021): mixing ``lambda ~ N(0, 1/rho)`` gives the nonnegative
supermartingale ``sqrt(rho / (v + rho)) exp(S^2 / (2 (v + rho)))``, and Ville's inequality bounds
the chance it ever exceeds ``1/alpha``, so with probability ``>= 1 - alpha``, for every ``t``:
``|S_t| <= sqrt((v_t + rho) log((v_t + rho) / (rho alpha^2)))`` with ``v_t = sigma^2 t``.
Observations in ``[a, b]`` are sub-Gaussian with ``sigma^2 = (b - a)^2 / 4`` (Hoeffding's lemma).

:func:`hoeffding_radius`: the fixed-sample Hoeffding bound, for a block of a known size;
:func:`bernstein_radius`: the empirical Bernstein bound of Maurer & Pontil ("Empirical Bernstein
bounds and sample variance penalization", COLT 2009, Theorem 4), tighter when the observations
vary less than their range allows.
"""

from __future__ import annotations

import math

__all__ = [
    "bernstein_radius",
    "check_level",
    "hoeffding_radius",
    "mixture_radius",
    "mixture_rho",
]


def check_level(alpha: object, name: str = "level") -> float:
    """``alpha`` as a float in (0, 1), or a :class:`ValueError` / :class:`TypeError`."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise TypeError(f"{name} must be a number in (0, 1), got {alpha!r}")
    if math.isnan(alpha) or not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"{name} must be in (0, 1) (an error probability), got {alpha!r}")
    return float(alpha)


def mixture_rho(alpha: float, variance_proxy: float, t_opt: float) -> float:
    """The mixture's ``rho`` that makes the boundary tightest near ``t_opt`` observations
    (Howard et al. 2021, section 3.5): ``v / (2 log(1/alpha) + log(1 + 2
    log(1/alpha)))`` with ``v = sigma^2 t_opt``; any ``rho > 0`` gives a valid sequence."""
    la = 2.0 * math.log(1.0 / alpha)
    return variance_proxy * t_opt / (la + math.log(1.0 + la))


def mixture_radius(n: int, alpha: float, span: float = 1.0, t_opt: float = 500.0) -> float:
    """Radius around the running mean of ``n`` observations in an interval of length ``span``
    (anytime-valid at level ``alpha``, two-sided; ``inf`` for ``n == 0``)."""
    if n <= 0:
        return math.inf
    var = span * span / 4.0
    rho = mixture_rho(alpha, var, t_opt)
    v = var * n
    return math.sqrt((v + rho) * math.log((v + rho) / (rho * alpha * alpha))) / n


def hoeffding_radius(n: int, alpha: float, span: float = 1.0) -> float:
    """Two-sided Hoeffding radius of the mean of ``n`` independent observations in an interval of
    length ``span``, at level ``alpha`` (``inf`` for ``n == 0``)."""
    if n <= 0:
        return math.inf
    return span * math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


def bernstein_radius(n: int, variance: float, alpha: float, span: float = 1.0) -> float:
    """Two-sided empirical Bernstein radius (Maurer & Pontil 2009, Theorem 4, each side at
    ``alpha / 2``) of the mean of ``n`` independent observations in an interval of length
    ``span`` whose unbiased sample variance is ``variance`` (``inf`` for ``n < 2``)."""
    if n < 2:
        return math.inf
    log = math.log(4.0 / alpha)
    return math.sqrt(2.0 * variance * log / n) + 7.0 * span * log / (3.0 * (n - 1))
