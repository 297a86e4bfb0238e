"""Hypothesis settings of the conformance suite, applied to aiayn's own tests only.

The suite never loads or registers a Hypothesis profile: a user's profile stays the user's, for
their own tests in the same run. Each conformance test carries its settings explicitly
(``@profile()`` or ``@profile(fraction)``), built from Hypothesis's built-in ``default`` profile
plus one of these:

- ``dev`` (the default): random, 40 examples per test;
- ``ci``: derandomized (the same examples every run), 40 examples per test;
- ``thorough``: 1000 examples per test, for a long local run;
- ``smoke``: 8 examples per test, to see that an installation works end to end;
- ``quick``: derandomized, 20 examples per test: CI's ``make test`` (``.ci/run``), which runs the suite on every
  built-in within its 10 minutes;
- ``short``: random, 20 examples per test: ``make test`` elsewhere (fresh draws every run, the same size as CI's).

The committed reports are ``ci``'s and the false-alarm counts ``dev``'s and ``thorough``'s.

Choose with ``--aiayn-profile NAME`` (``aiayn check --profile NAME``) or ``$AIAYN_PROFILE``.
Deadlines stay off in every profile: these machines are shared and noisy; a hang is caught by the
per-call time limit instead (``run/plugin.py``). ``$AIAYN_FIND_ONLY=1`` (set by the mutant runner,
``studies/mutants.py``) keeps a profile's example generation but skips shrinking and the example
database: it only asks whether a failure is found. A check that an implementation declares as a
known deviation is not shrunk either (:func:`without_shrinking`): its failure is expected.

Examples that fail are kept in aiayn's cache (``aiayn.environment.cache_dir()/hypothesis``), not
in the current directory; the derandomized profiles keep none.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from hypothesis import settings

__all__ = ["PROFILES", "activate", "active", "examples", "profile", "without_shrinking"]

#: Name -> (examples per test, derandomized).
PROFILES: dict[str, tuple[int, bool]] = {
    "dev": (40, False),
    "ci": (40, True),
    "thorough": (1000, False),
    "smoke": (8, True),
    "quick": (20, True),
    "short": (20, False),
}

_ACTIVE: list[str] = []
F = TypeVar("F", bound=Callable[..., Any])


def activate(name: str | None) -> str:
    """Make ``name`` (or ``$AIAYN_PROFILE``, else ``dev``) the profile of the tests collected from now on."""
    name = name or os.environ.get("AIAYN_PROFILE") or "dev"
    if name not in PROFILES:
        raise ValueError(f"unknown aiayn profile {name!r}; choose one of {', '.join(PROFILES)}")
    _ACTIVE[:] = [name]
    return name


def active() -> str:
    """The active profile's name (``$AIAYN_PROFILE`` or ``dev`` until :func:`activate` is called)."""
    return _ACTIVE[0] if _ACTIVE else activate(None)


def examples(fraction: float = 1.0) -> int:
    """Examples for a test: ``fraction`` of the active profile's, at least 3."""
    return max(3, int(PROFILES[active()][0] * fraction))


def _database() -> Any:
    from hypothesis.database import DirectoryBasedExampleDatabase

    from aiayn.environment import cache_dir

    return DirectoryBasedExampleDatabase(str(cache_dir() / "hypothesis"))


def current_settings(fraction: float = 1.0) -> settings:
    """The settings object of a test under the active profile (Hypothesis is imported here, not
    when this module is: the plugin and the CLI read the profile names before pytest starts)."""
    from hypothesis import HealthCheck, Phase, settings

    _, derandomize = PROFILES[active()]
    find_only = bool(os.environ.get("AIAYN_FIND_ONLY"))
    # No explain phase: after shrinking, Hypothesis reruns the failing example with each part varied to comment on
    # which parts matter (a comment the suite's messages do not carry); on a failing whole model it took 28 of 40 s.
    extra: dict[str, Any] = {"phases": (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)}
    if find_only:
        extra["phases"] = (Phase.explicit, Phase.generate)
    return settings(
        settings.get_profile("default"),
        max_examples=examples(fraction),
        deadline=None,
        derandomize=derandomize,
        database=None if (derandomize or find_only) else _database(),
        print_blob=derandomize,
        suppress_health_check=[HealthCheck.too_slow],
        **extra,
    )


def without_shrinking(own: settings) -> settings:
    """``own`` without the shrink phase (nor the explain phase that follows it).

    For a check the implementation declares as a known deviation: the check still runs every example until one
    fails (and fails the run if none does), but its failure is expected, so the minimal failing example is not
    searched for; the diagnosis reads the examples that ran. Shrinking is the costly part of a failing check (a
    whole-model example shrinks through dozens of shapes, each a compile on a library that compiles per shape).
    """
    from hypothesis import Phase, settings

    return settings(own, phases=tuple(p for p in own.phases if p not in (Phase.shrink, Phase.explain)))


def profile(fraction: float = 1.0) -> Callable[[F], F]:
    """Decorator: the active profile's settings, with ``fraction`` of its examples (for tests whose examples are
    expensive)."""

    def decorate(test: F) -> F:
        return current_settings(fraction)(test)

    return decorate
