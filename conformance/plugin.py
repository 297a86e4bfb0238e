"""The pytest side of ``pytest conformance``: options, which implementations and dtypes, the header, the report.

Loaded by ``conformance/conftest.py``. Options (available when ``conformance`` is on the command
line):

- ``--impl NAME|module:attr`` (repeatable): implementations to check; default the environment
  variable ``AIAYN_IMPL`` (comma-separated), else every built-in whose import works (the torch
  built-ins are skipped, with a note in the header, when torch is not installed).
- ``--dtype DTYPE`` (repeatable): check only these of each implementation's declared dtypes.
- ``--aiayn-report DIR``: write ``conformance-<impl>.md`` and ``.json`` there at the end.

Every test carries ``@pytest.mark.equation(NAME)`` and takes the parameters ``impl`` and ``dtype``;
:func:`pytest_generate_tests` expands them over the implementations and their declared dtypes
(an equation an implementation does not provide becomes one skipped test, "not provided").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from conformance import harness
from implementations import registry
from implementations.protocol import DTYPES, provided_equations

_LOADED = pytest.StashKey[list["Loaded"]]()
_STATS = pytest.StashKey[harness.Stats]()


@dataclass
class Loaded:
    """One requested implementation: loaded, or why not (and whether that is an error or a skip)."""

    spec: str
    impl: Any = None
    error: str = ""
    skip: bool = False  # a default built-in whose optional dependency is missing

    @property
    def name(self) -> str:
        return getattr(self.impl, "name", None) or self.spec


class LoadFailure:
    """Stands in for an implementation that could not be loaded: its contract test fails with ``message``."""

    def __init__(self, spec: str, message: str) -> None:
        self.name, self.spec, self.message = spec, spec, message

    def __repr__(self) -> str:
        return f"<could not load {self.spec!r}>"


# --------------------------------------------------------------------------------------------
# options and loading


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiayn", "aiayn conformance suite")
    group.addoption("--impl", action="append", default=[], metavar="NAME|module:attr",
                    help=f"implementation to check (repeatable): a built-in ({', '.join(registry.BUILTINS)}), an entry point, "
                         "or module:attr. Default: $AIAYN_IMPL (comma-separated), else every available built-in.")
    group.addoption("--dtype", action="append", default=[], choices=list(DTYPES),
                    help="check only these dtypes (repeatable); default every dtype each implementation declares")
    group.addoption("--aiayn-report", metavar="DIR", default=None,
                    help="write conformance-<impl>.md and .json (per equation x dtype) into DIR")


def _requested(config: pytest.Config) -> tuple[list[str], bool]:
    """(specs, explicit): from --impl, else $AIAYN_IMPL, else the built-ins (not explicit)."""
    specs = list(config.getoption("--impl") or [])
    if not specs and os.environ.get("AIAYN_IMPL", "").strip():
        specs = [s.strip() for s in os.environ["AIAYN_IMPL"].split(",") if s.strip()]
    if specs:
        return specs, True
    return list(registry.BUILTINS), False


def _missing_optional_dependency(exc: BaseException) -> str | None:
    """The name of a missing third-party module behind a load failure (torch, ...), else None."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, ModuleNotFoundError) and cause.name and cause.name.split(".")[0] not in ("implementations", "conformance", "reference"):
            return cause.name
        cause = cause.__cause__
    return None


def _load(spec: str, explicit: bool) -> Loaded:
    try:
        impl = registry.load(spec)
    except registry.ImplementationNotFound as exc:
        missing = _missing_optional_dependency(exc)
        if missing and not explicit:
            return Loaded(spec, error=f"needs {missing}, which is not installed", skip=True)
        return Loaded(spec, error=str(exc))
    harness.register_spec(impl, spec)
    return Loaded(spec, impl=impl)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "equation(name, dtypes='all', load_failures=False): the equation (implementations.protocol.EQUATIONS, or 'contract') "
                                       "a conformance test checks; dtypes='first' runs only the implementation's first dtype; "
                                       "load_failures=True makes an implementation that cannot be loaded fail this test")
    # overflow in a budget's float64 magnitudes (a vacuous bound) is expected and handled there
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:conformance")
    specs, explicit = _requested(config)
    config.stash[_LOADED] = [_load(spec, explicit) for spec in specs]


def loaded(config: pytest.Config) -> list[Loaded]:
    """The implementations of this run (in --impl order)."""
    return config.stash[_LOADED]


# --------------------------------------------------------------------------------------------
# parametrization


def _provided(impl: Any) -> frozenset[str]:
    try:
        return provided_equations(impl)
    except Exception:  # a broken provides() is reported by the contract test
        return frozenset()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("equation")
    if marker is None:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: a conformance test needs @pytest.mark.equation(NAME)")
    equation, mode = marker.args[0], marker.kwargs.get("dtypes", "all")
    wanted = set(metafunc.config.getoption("--dtype") or DTYPES)
    names = [entry.name for entry in loaded(metafunc.config)]
    params = []
    for entry in loaded(metafunc.config):
        label = entry.name if names.count(entry.name) == 1 else entry.spec
        if entry.impl is None:
            if marker.kwargs.get("load_failures") and not entry.skip:
                params.append(pytest.param(LoadFailure(entry.spec, entry.error), "-", id=f"{label}-load"))
            else:
                why = entry.error if entry.skip else "could not be loaded (see test_declarations_follow_the_contract)"
                params.append(pytest.param(None, "-", id=f"{label}-unavailable", marks=pytest.mark.skip(reason=f"{entry.spec}: {why}")))
            continue
        impl = entry.impl
        dtypes = tuple(getattr(impl, "dtypes", ()) or ())
        chosen = [d for d in (dtypes[:1] if mode == "first" else dtypes) if d in wanted]
        if equation != "contract" and equation not in _provided(impl):
            params.append(pytest.param(impl, chosen[0] if chosen else "-", id=f"{label}-not-provided",
                                       marks=pytest.mark.skip(reason=f"{equation} not provided by {entry.name}")))
            continue
        params += [pytest.param(impl, d, id=f"{label}-{d}") for d in chosen]
    if not params:
        params = [pytest.param(None, "-", id="no-implementation", marks=pytest.mark.skip(reason="no implementation/dtype selected"))]
    metafunc.parametrize(("impl", "dtype"), params)


def deviation_key(item: pytest.Item) -> str:
    """The name an implementation uses in ``known_deviations`` for this test.

    The test function's name without ``test_``, plus its own parameters other than the
    implementation and dtype in brackets, e.g. ``attention_poison_at_masked_positions_changes_nothing[nan_keys]``.
    """
    name = getattr(item, "originalname", item.name).removeprefix("test_")
    callspec = getattr(item, "callspec", None)
    extra = [str(v) for k, v in (callspec.params.items() if callspec else ()) if k not in ("impl", "dtype")]
    return f"{name}[{'-'.join(extra)}]" if extra else name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A failure the implementation declares in ``known_deviations`` is expected, strictly.

    A declaration names the test as :func:`deviation_key` does, optionally followed by
    ``@<dtype>`` to limit it to one dtype. The test still runs: if it fails it is reported as a known deviation (with the declared
    reason), and if it passes the run fails (strict), so a declaration cannot outlive the
    deviation it explains.
    """
    for item in items:
        callspec = getattr(item, "callspec", None)
        impl = callspec.params.get("impl") if callspec else None
        declared = getattr(impl, "known_deviations", None) or {}
        key, dtype = deviation_key(item), callspec.params.get("dtype") if callspec else None
        reason = (declared.get(key) or declared.get(f"{key}@{dtype}")) if hasattr(declared, "get") else None
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"known deviation declared by {getattr(impl, 'name', impl)}: {reason}"))


# --------------------------------------------------------------------------------------------
# statistics per test, gathered on the controller (works under pytest-xdist)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    stats = harness.Stats()
    item.stash[_STATS] = stats
    token = harness.current_stats().set(stats)
    try:
        yield
    finally:
        harness.current_stats().reset(token)


def _spec_of(impl: Any, config: pytest.Config) -> str | None:
    for entry in loaded(config):
        if entry.impl is impl and impl is not None:
            return entry.spec
    return getattr(impl, "spec", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    callspec = getattr(item, "callspec", None)
    marker = item.get_closest_marker("equation")
    if callspec is None or marker is None or "impl" not in callspec.params:
        return
    if not (rep.when == "call" or (rep.when == "setup" and not rep.passed)):
        return
    impl = callspec.params["impl"]
    stats = item.stash.get(_STATS, harness.Stats())
    reason, outcome = "", rep.outcome
    if hasattr(rep, "wasxfail"):  # a declared known deviation that did deviate
        reason, outcome = str(rep.wasxfail), "known deviation"
    elif rep.skipped and isinstance(rep.longrepr, tuple):
        reason = str(rep.longrepr[2])
    rep.user_properties.append(("aiayn", {
        "spec": _spec_of(impl, item.config) or "-",
        "equation": marker.args[0],
        "dtype": callspec.params.get("dtype", "-"),
        "test": getattr(item, "originalname", item.name),
        "outcome": outcome,
        "reason": reason,
        **stats.as_dict(),
    }))


#: Results of this session's tests (on the xdist controller: every worker's, via user_properties).
_CONFIG_RESULTS: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == "aiayn":
            _CONFIG_RESULTS.append(value)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    directory = session.config.getoption("--aiayn-report")
    if not directory or _is_worker(session.config):
        return
    from conformance import report

    for entry in loaded(session.config):
        if entry.skip:  # an optional dependency is missing: nothing to report, and no committed report to overwrite
            continue
        report.write(Path(directory), entry, [r for r in _CONFIG_RESULTS if r["spec"] == entry.spec], run_info(session.config))


# --------------------------------------------------------------------------------------------
# the header


def run_info(config: pytest.Config) -> dict[str, str]:
    """Hypothesis profile and seed of this run (for the header and the reports' signature)."""
    profile = settings.get_current_profile_name()
    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        seed = "derandomized" if settings().derandomize else "random"
    return {"profile": str(profile), "seed": str(seed), "max_examples": str(settings().max_examples)}


def pytest_report_header(config: pytest.Config) -> list[str]:
    info = run_info(config)
    lines = [f"aiayn conformance: hypothesis profile {info['profile']} ({info['max_examples']} examples per test), seed {info['seed']}"]
    wanted = config.getoption("--dtype") or []
    for entry in loaded(config):
        if entry.impl is None:
            lines.append(f"  {entry.spec}: {'skipped' if entry.skip else 'NOT LOADED'} ({entry.error.splitlines()[0] if entry.error else ''})")
            continue
        impl = entry.impl
        dtypes = [d for d in impl.dtypes if not wanted or d in wanted]
        lines.append(f"  {impl.name} ({impl.version}) on {impl.device}, dtypes {', '.join(dtypes) or 'none selected'}"
                     + ("" if entry.spec == impl.name else f" [{entry.spec}]"))
    return lines
