"""``python -m stability conformance``: check any segment softmax at the dtype's limits
(``stability.testing``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from stability.commands.flags import add_plugin_flag
from stability.core.errors import StabilityError


def add_conformance_parser(sub: argparse._SubParsersAction) -> None:
    from stability.model.softmax_inputs import DTYPES

    conformance = sub.add_parser(
        "conformance",
        help="check a segment softmax fn(logits, segment_ids, num_segments) at the dtype's "
        "limits (exit 1 when a property fails)",
        description="Drive MODULE:NAME with Hypothesis inputs up to and past where exp "
        "overflows and underflows, and check its outputs and gradients against a longdouble "
        "reference (docs/conformance.md).",
    )
    conformance.add_argument(
        "target", metavar="MODULE:NAME", help="the softmax, e.g. my_module:my_softmax"
    )
    conformance.add_argument(
        "--dtype",
        action="append",
        choices=DTYPES,
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
    from stability.model.softmax_inputs import DTYPES
    from stability.testing import check_segment_softmax

    fn = _import_target(args.target)
    report = check_segment_softmax(
        fn, dtypes=tuple(args.dtype or DTYPES), mask=args.mask, profile=args.profile
    )
    print(report)
    return 0 if report.passed else 1


def _import_target(target: str):
    """The object ``module:name`` names; a factory marked by ``stability.testing.adapters.adapter``
    is called for its ``Implementation``."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise StabilityError(f"{target!r} must be MODULE:NAME, e.g. my_module:my_softmax")
    if os.getcwd() not in sys.path:  # like `python -m`: a module beside you can be named
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise StabilityError(
            f"{target}: module {module_name!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    try:
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise StabilityError(f"{target}: module {module_name!r} has no {name!r}") from None
    return obj() if getattr(obj, "makes_implementation", False) else obj
