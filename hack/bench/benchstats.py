"""How the benchmarks print a measurement over rounds: median [min-max], and a ratio only where
two ranges do not overlap (a ratio of medians inside overlapping spreads would claim a difference
the rounds do not show). One copy for every benchmark, so their tables read the same."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

DASH = "\u2013"  # en dash, for ranges in the tables


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float], digits: int = 3, *, scale: float = 1.0) -> str:
    """`median [min-max]` of `values` times `scale`, with `digits` decimals."""
    lo, mid, hi = min(values) * scale, med(values) * scale, max(values) * scale
    sep = " to " if lo < 0 else DASH  # a dash between negatives reads badly
    return f"{mid:.{digits}f} [{lo:.{digits}f}{sep}{hi:.{digits}f}]"


def ratio(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """median(ours) / median(theirs), only where the two ranges do not overlap."""
    if max(ours) < min(theirs) or min(ours) > max(theirs):
        return f"{med(ours) / med(theirs):.2f}x"
    return "within spread"


def target(ours: Sequence[float], theirs: Sequence[float], limit: float, *, at_most: bool) -> str:
    """median(ours) / median(theirs) against a target ratio, always printed (a target is judged
    on it), with whether the two ranges overlap so a reader can tell noise from a difference."""
    r = med(ours) / med(theirs)
    met = r <= limit if at_most else r >= limit
    apart = (
        "ranges apart" if max(ours) < min(theirs) or min(ours) > max(theirs) else "ranges overlap"
    )
    verdict = "met" if met else "MISSED"
    return f"{r:.2f}x (target {'<=' if at_most else '>='} {limit}x: {verdict}; {apart})"
