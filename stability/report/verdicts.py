"""What a change did to a failure, in words shared by the doctor and the claims: the verdict
words of a remedy and the one "delays" rule.

A change *delays* a failure when the median failure epoch (or step) with the change is at
least ``DELAY_FACTOR`` times the median without it. The doctor judges a remedy by it, and the
claims judge "delayed gradient explosion" by it: one factor, one comparison.
"""

from __future__ import annotations

#: A change delays a failure when its median failure epoch is at least this many times the
#: reference's.
DELAY_FACTOR = 1.5

FIXES, DELAYS, DOES_NOT_HELP, NOT_APPLICABLE = "fixes", "delays", "does not help", "not applicable"
#: A remedy that avoids the failure on the seeds it was found on, but not on fresh seeds
#: (other initial weights and batch orders), and not later enough there to delay it.
HOLDS_ON_THESE_SEEDS = "holds on these seeds"
#: A remedy that avoids the failure on the case's data, on its seeds and on fresh ones, but
#: not on data pushed toward the failure (the doctor's ``push``).
HOLDS_ON_THIS_DATA = "holds on this data"
#: Every verdict of a remedy, best first.
VERDICTS = (FIXES, HOLDS_ON_THIS_DATA, HOLDS_ON_THESE_SEEDS, DELAYS, DOES_NOT_HELP, NOT_APPLICABLE)


def delays(median: float, reference: float, factor: float = DELAY_FACTOR) -> bool:
    """Whether a median failure epoch (or step) ``median`` is at least ``factor`` times the
    reference's ``reference`` (``inf``: no failure within the budget, later than any)."""
    return median >= factor * reference
