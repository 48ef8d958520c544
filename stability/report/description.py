"""The text a case's report opens with: the case's description, after a note when XLA
trained it and before a line naming the command line's ``--set`` overrides."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stability.core.limits import exp_limits

if TYPE_CHECKING:
    from stability.sweep.cases import Case


def xla_note(dtype: str) -> str:
    """The note a report of a case trained under XLA opens with: its rows do not say so.

    XLA rewrites the softmax division's gradient ``(-x / y) / y`` as ``-x / (y * y)``, so
    ``y * y`` flushes to 0 at half the logit where ``y`` itself does (``tests/test_xla.py``).
    """
    limits = exp_limits(dtype)
    return (
        f"Trained with `jit_compile` (XLA) on padded batches. XLA rewrites arithmetic: in "
        f"{dtype}, the naive softmax's gradient fails once a node's logits are all below "
        f"-{limits.underflow / 2:.2f}, half of the -{limits.underflow:.2f} where it fails "
        f"without XLA (docs/findings.md), so these rows are not comparable with a run "
        f"without XLA. The Risk lines and plots below still draw the limits without XLA."
    )


def report_description(case: Case) -> str:
    text = f"{xla_note(case.dtype)}\n\n{case.description}" if case.jit_compile else case.description
    return f"{text}\n\n{overrides_note(case)}" if case.overrides else text


def overrides_note(case: Case) -> str:
    """The report's line saying which settings the command line changed (``--set``)."""
    flags = " ".join(f"`--set {override}`" for override in case.overrides)
    return f"Settings changed on the command line, over the case file: {flags}."
