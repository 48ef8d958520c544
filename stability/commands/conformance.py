"""``python -m stability conformance``: check any segment softmax at the dtype's limits
(``stability.testing``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stability.commands.flags import add_plugin_flag
from stability.core.errors import StabilityError, did_you_mean
from stability.core.plugins import import_spec


def add_conformance_parser(sub: argparse._SubParsersAction) -> None:
    from stability.core.limits import FLOAT_DTYPES

    conformance = sub.add_parser(
        "conformance",
        help="check a segment softmax fn(logits, segment_ids, num_segments) at the dtype's "
        "limits (exit 1 when a property fails)",
        description="Drive MODULE:NAME with Hypothesis inputs up to and past where exp "
        "overflows and underflows, and check its outputs and gradients against a longdouble "
        "reference (docs/conformance.md).",
    )
    conformance.add_argument(
        "target",
        metavar="MODULE:NAME",
        help="the softmax: a module and its function, e.g. my_module:my_softmax, or a .py "
        "file and its function, e.g. ../lib/my_softmax.py:my_softmax",
    )
    conformance.add_argument(
        "--dtype",
        action="append",
        choices=FLOAT_DTYPES,
        help="a dtype to check (repeatable; default: all three)",
    )
    conformance.add_argument(
        "--profile", choices=("ci", "thorough"), help="examples per property (default: ci)"
    )
    conformance.add_argument(
        "--mask", action="store_true", help="the softmax takes a mask: fn(..., num_segments, mask)"
    )
    add_plugin_flag(conformance)


def conformance_command(args: argparse.Namespace) -> int:
    from stability.core.limits import FLOAT_DTYPES
    from stability.testing import check_segment_softmax

    fn = _import_target(args.target)
    report = check_segment_softmax(
        fn, dtypes=tuple(args.dtype or FLOAT_DTYPES), mask=args.mask, profile=args.profile
    )
    print(report)
    return 0 if report.passed else 1


def _import_target(target: str) -> Any:
    """The object ``MODULE:NAME`` or ``FILE.py:NAME`` names (a file relative to the working
    folder, or absolute); a factory marked by ``stability.testing.adapters.adapter`` is
    called for its ``Implementation``."""
    module_spec, _, name = target.rpartition(":")  # the last colon: a path may hold one
    if not module_spec or not name:
        raise StabilityError(
            f"{target!r} must be MODULE:NAME or FILE.py:NAME, e.g. my_module:my_softmax or "
            "../lib/my_softmax.py:my_softmax"
        )
    module = sys.modules[import_spec(module_spec, what="conformance target")]
    obj: Any = module
    for depth, part in enumerate(name.split(".")):
        if not hasattr(obj, part):
            known = [n for n in dir(obj) if not n.startswith("_")]
            where = module_spec if depth == 0 else ".".join(name.split(".")[:depth])
            raise StabilityError(
                f"conformance target {target!r}: {where} has no {part!r}."
                f"{did_you_mean(part, known)} It defines: {', '.join(known) or 'nothing'}."
            )
        obj = getattr(obj, part)
    return obj() if getattr(obj, "makes_implementation", False) else obj
