"""The Hypothesis profiles, one meaning each, for the harness's tests and yours.

A profile is one number of examples per Hypothesis search, named by
``$STABILITY_HYPOTHESIS_PROFILE`` (default ``ci``):

- ``ci``: 200 examples, derandomized, so every run tries the same examples, and bounded so
  the default test run stays within its time;
- ``thorough``: 5000 examples with fresh randomness, for a long local run.

The conformance suite (``stability.testing.conformance``) runs six searches per dtype,
each calling the softmax once per example, so it takes ``CONFORMANCE_SHARE`` of the
profile's examples per property (``conformance_examples``): 60 with ``ci``, which keeps one
implementation in one dtype within its 10 s goal (benchmarks/test_conformance_speed.py),
and 1500 with ``thorough``. It always derandomizes, so its report is reproducible.

Nothing is registered with Hypothesis on import, so a profile of yours named ``ci`` is
left alone: ``register_profiles()`` registers these (the harness's tests/conftest.py
calls it) and loads the one the variable names.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from stability.core.errors import StabilityError

#: The environment variable that names the profile.
PROFILE_VARIABLE = "STABILITY_HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "ci"
#: The share of a profile's examples the conformance suite spends on each property.
CONFORMANCE_SHARE = 0.3

_COMMON = {
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
_BASE = settings.get_profile("default")  # not whichever profile is loaded at import
_PROFILES: dict[str, settings] = {  # name -> the settings it stands for
    "ci": settings(_BASE, max_examples=200, derandomize=True, database=None, **_COMMON),
    "thorough": settings(_BASE, max_examples=5000, **_COMMON),
}
#: The profiles' names.
PROFILE_NAMES = tuple(_PROFILES)


def profile_name(name: str | None = None) -> str:
    """``name``, else ``$STABILITY_HYPOTHESIS_PROFILE``, else ``"ci"``; ``StabilityError``
    for a name that is not a profile."""
    name = name or os.environ.get(PROFILE_VARIABLE) or DEFAULT_PROFILE
    if name not in _PROFILES:
        raise StabilityError(f"profile {name!r} is unknown; known: {', '.join(PROFILE_NAMES)}")
    return name


def get_profile(name: str | None = None) -> settings:
    """The Hypothesis ``settings`` of the profile ``profile_name(name)``."""
    return _PROFILES[profile_name(name)]


def conformance_examples(name: str | None = None) -> int:
    """Examples per property and dtype in a conformance check under the profile:
    ``CONFORMANCE_SHARE`` of its ``max_examples``."""
    return round(CONFORMANCE_SHARE * get_profile(name).max_examples)


def register_profiles(*, load: bool = True) -> str:
    """Register every profile with Hypothesis under its name and, with ``load``, load the
    one ``profile_name()`` picks; returns that name."""
    for name, profile in _PROFILES.items():
        settings.register_profile(name, profile)
    name = profile_name()
    if load:
        settings.load_profile(name)
    return name
