"""The rule every registry keeps: a name belongs to the first function registered under it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stability.core.errors import StabilityError


def qualified(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of ``fn``: how a registration names its owner."""
    return f"{fn.__module__}.{fn.__qualname__}"


def check_new_name(
    kind: str, name: str, old: Callable[..., Any] | None, new: Callable[..., Any]
) -> None:
    """Refuse ``new`` under ``name`` if another function already holds it (re-registering the
    same function, as a re-imported plugin does, is allowed)."""
    if old is not None and qualified(old) != qualified(new):
        raise StabilityError(
            f"{kind} {name!r} is already registered by {qualified(old)}; choose another name"
        )
