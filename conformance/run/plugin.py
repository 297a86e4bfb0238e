"""aiayn's pytest plugin: the options, parametrization, exit codes and report of the conformance suite.

Registered through the ``pytest11`` entry point ``aiayn``, so it is present in every pytest run
of an environment where aiayn is installed, and does nothing there until asked: it adds its
options and its marker, and acts only on tests marked ``@pytest.mark.aiayn_equation(NAME)`` (the
suite's own) or when ``--impl`` names an implementation. It never loads or changes a Hypothesis
profile (``inputs/profiles.py``) and imports no array library at import time.

Ways in:

- ``aiayn check SPEC`` (``aiayn/cli.py``): the suite in worker processes, with a time limit per call;
- ``pytest --pyargs aiayn.conformance --impl SPEC`` from anywhere, or ``pytest conformance --impl
  SPEC`` in a checkout;
- a test module of your own that pulls the suite in for your implementation, as ONNX's backend
  tests are included by a backend's test module (:func:`aiayn.conformance.suite`)::

      # tests/test_aiayn_conformance.py
      from aiayn.conformance import suite
      globals().update(suite("mypkg.attention:Mine"))

Options:

- ``--impl NAME|module:attr`` (repeatable): implementations to check; default ``$AIAYN_IMPL``
  (comma-separated), else every built-in whose import works (a built-in whose optional dependency
  is missing is skipped, with a note in the header). A named implementation that cannot be
  loaded, or a ``--dtype`` it does not declare, stops the run with exit 4 (a usage error).
- ``--dtype DTYPE`` (repeatable): check only these of each implementation's declared dtypes.
- ``--aiayn-profile NAME``: dev (default), ci, thorough or smoke (``inputs/profiles.py``).
- ``--aiayn-timeout SECONDS``: the time limit of one call into an implementation (default 120;
  0 = none). In worker processes (``-n N``) a call past it, a segfault or an abort becomes that
  check's failure and the run goes on (``run/isolation.py``). A method that hung once is not called
  again in the run: its later calls fail at once, naming the first hang, so a hanging
  implementation adds at most (methods that hang) x (workers, or 1) x limit.
- ``--aiayn-report DIR``: write ``conformance-<impl>.md`` and ``.json`` there at the end (an implementation none
  of whose checks finished gets none: a line says so and why, and the run does not exit 0).
- ``--aiayn-agreement-only``: only each equation's agreement test, decoding's, and the contract (a smoke selection).
- ``--aiayn-no-grad``, ``--aiayn-no-decode``: skip the gradient tests, the decoding tests (their rows read "not run").

Exit status, by pytest's conventions: 0 every check passed; 1 a check failed; 4 a usage error
(an implementation that cannot be loaded, an undeclared ``--dtype``, or a selection in which no
check ran: all deselected or skipped).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shutil
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aiayn.conformance.directions import BACKWARD, DECODE, DIRECTIONS, FORWARD  # light: enum only
from aiayn.conformance.inputs.profiles import PROFILES  # light: Hypothesis is imported when a test's settings are built
from aiayn.conformance.report.coverage import OUT_OF_SCOPE  # light: the plugin imports no array library
from aiayn.conformance.report.results import Outcome, Row, Status, TestResult  # light: the standard library only

#: The dtypes an implementation may declare (the contract's ``DTYPES``; repeated here so that
#: loading the plugin imports nothing but pytest).
_DTYPES = ("float64", "float32", "float16", "bfloat16")
_PROFILES = tuple(PROFILES)
_MARK = "aiayn_equation"

_STATE = pytest.StashKey["_Run"]()
_STATS = pytest.StashKey[Any]()
_DECLARED = pytest.StashKey[bool]()  # the item is a known deviation its implementation declares


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


@dataclass
class _Run:
    """What this session knows: requested specs, loaded implementations, results (on the controller)."""

    explicit: list[str] | None  # --impl / $AIAYN_IMPL, or None for the default built-ins
    device: str | None = None  # --aiayn-device
    loaded: dict[str, Loaded] = field(default_factory=dict)  # spec -> Loaded
    results: list[TestResult] = field(default_factory=list)  # on the xdist controller: every worker's
    isolation_ready: bool = False
    testrunuids: set[str] = field(default_factory=set)
    crashes: list[str] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)
    usage_error: str = ""
    written: list[str] = field(default_factory=list)  # the report files, or what could not be written and where it went
    interrupted: bool = False  # the session ended by SIGINT or SIGTERM (pytest's INTERRUPTED): reports are partial
    config: pytest.Config | None = None  # (the controller's) for the lines printed as failures arrive
    in_process: bool = False  # --aiayn-in-process: the implementations share this process (the verdict not isolated)
    shape_salt: int | None = None  # which few sets of sizes this run draws from (_shape_salt), once chosen


# --------------------------------------------------------------------------------------------
# options and configuration


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiayn", "aiayn conformance suite (aiayn check)")
    group.addoption(
        "--impl",
        action="append",
        default=[],
        metavar="NAME|module:attr",
        help="implementation to check (repeatable): a built-in (aiayn list), an entry point of group "
        "aiayn.implementations, or module:attr. Default: $AIAYN_IMPL (comma-separated), else every available built-in.",
    )
    group.addoption(
        "--dtype",
        action="append",
        default=[],
        choices=list(_DTYPES),
        help="check only these dtypes (repeatable); default every dtype each implementation declares",
    )
    group.addoption(
        "--aiayn-device",
        default=None,
        metavar="DEVICE",
        help="place every implementation on DEVICE (e.g. cuda, cuda:1): passed to its constructor's device argument; "
        "one that cannot be placed there is a usage error",
    )
    group.addoption(
        "--aiayn-profile",
        default=None,
        choices=list(_PROFILES),
        help="examples per check: dev (40, random; default, or $AIAYN_PROFILE), ci (40, derandomized), "
        "thorough (1000), smoke (8)",
    )
    group.addoption(
        "--aiayn-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time limit of one call into an implementation (default 120; 0: none); with -n N a crash or hang "
        "past it fails that check and the run goes on; a method that hung is not called again (its later calls "
        "fail at once), so hangs add at most (methods that hang) x (workers, or 1) x limit",
    )
    group.addoption(
        "--aiayn-report",
        metavar="DIR",
        default=None,
        help="write conformance-<impl>.md and .json (per equation x dtype) into DIR",
    )
    group.addoption(
        "--aiayn-force",
        action="store_true",
        default=False,
        help="with --aiayn-report: replace a report of larger scope there (default: a smaller run writes beside it)",
    )
    group.addoption(
        "--aiayn-no-grad",
        action="store_true",
        default=False,
        help="skip the gradient tests (the backward rows read 'not run'): aiayn check --no-grad",
    )
    group.addoption(
        "--aiayn-no-decode",
        action="store_true",
        default=False,
        help="skip the decoding tests (the decode rows read 'not run'): aiayn check --no-decode",
    )
    group.addoption(
        "--aiayn-agreement-only",
        action="store_true",
        default=False,
        help="run only each equation's agreement test with the oracle (test_<equation>) and the contract: a quick "
        "smoke selection (aiayn zoo --quick); the property tests and fixed cases are deselected",
    )
    group.addoption(
        "--aiayn-in-process",
        action="store_true",
        default=False,
        help="load the implementations into this process (for a debugger) instead of each into a process of its own "
        "behind the contract (conformance/run/boundary.py): the report then says that its verdict was not isolated, "
        "for code in this process can change the judge",
    )
    group.addoption(
        "--aiayn-own-session",
        action="store_true",
        default=False,
        help="(set by aiayn check) this session runs only aiayn's suite: Hypothesis keeps its files in aiayn's cache, "
        "not in ./.hypothesis",
    )


def _explicit_specs(config: pytest.Config) -> list[str] | None:
    specs = list(config.getoption("--impl") or [])
    if not specs and os.environ.get("AIAYN_IMPL", "").strip():
        specs = [s.strip() for s in os.environ["AIAYN_IMPL"].split(",") if s.strip()]
    return specs or None


def pytest_configure(config: pytest.Config) -> None:
    from aiayn.conformance.run import declarations

    declarations.tests_from(deviation_names)  # what the contract check reads known_deviations' names against
    config.addinivalue_line(
        "markers",
        f"{_MARK}(name, dtypes=None, load_failures=False, needs=(), direction='forward'): an aiayn conformance "
        "test of equation NAME (aiayn.implementations.protocol.EQUATIONS, or 'contract'); direction='backward' "
        "for a test of its gradients (the equation's backward row); dtypes='first' runs "
        "only the implementation's first dtype, 'all' every dtype (default: the equation record's choice, "
        "aiayn.conformance.equations); load_failures=True makes an implementation that cannot "
        "be loaded fail it; needs: what of the domain the test needs ('masks:KIND', 'cross-attention', "
        "'batch:1'), so that it is out of scope for an implementation whose declared Scope excludes it",
    )
    run = _Run(
        explicit=_explicit_specs(config),
        device=config.getoption("--aiayn-device"),
        config=config,
        in_process=bool(config.getoption("--aiayn-in-process")),
    )
    config.stash[_STATE] = run
    config.pluginmanager.register(_Results(run), "aiayn-results")
    config.add_cleanup(lambda: _end_processes(run))
    profile = config.getoption("--aiayn-profile") or os.environ.get("AIAYN_PROFILE")
    if profile and profile not in _PROFILES:
        raise pytest.UsageError(
            f"aiayn: $AIAYN_PROFILE={profile!r} is not a profile; choose one of {', '.join(_PROFILES)}"
        )
    if run.explicit is None and not config.getoption("--aiayn-profile") and run.device is None:
        return  # not asked (yet): nothing is loaded until an aiayn test is collected
    from aiayn.conformance.inputs import profiles

    profiles.activate(profile)
    if config.getoption("--aiayn-own-session"):
        from hypothesis.configuration import set_hypothesis_home_dir

        from aiayn.environment import cache_dir

        set_hypothesis_home_dir(cache_dir() / "hypothesis")
    if run.explicit is not None and not _is_worker(config):
        _interrupt_on_sigterm(config)
    if run.explicit is not None:
        wanted = config.getoption("--dtype") or []
        for spec in run.explicit:
            entry = _load(run, spec, explicit=True)
            if entry.impl is None:
                raise pytest.UsageError(f"aiayn: {_one_line(entry.error)}")
            missing = [d for d in wanted if d not in tuple(getattr(entry.impl, "dtypes", ()) or ())]
            if missing:
                raise pytest.UsageError(
                    f"aiayn: {entry.name} ({spec}) does not declare dtype {', '.join(missing)}; "
                    f"it declares {', '.join(entry.impl.dtypes) or 'none'}"
                )


def _end_processes(run: _Run) -> None:
    """End the processes of the implementations this session loaded (``run/boundary.py``), once the session is over."""
    from aiayn.conformance.run.boundary import close

    for entry in run.loaded.values():
        close(entry.impl)


def _interrupt_on_sigterm(config: pytest.Config) -> None:
    """SIGTERM (a CI job cancelled, ``kill``) ends a run that asked for aiayn's checks the way Ctrl-C does: pytest's
    INTERRUPTED (exit 2), its session finished, the partial report named as such (``report.write``) and the workers'
    record folders removed. Only where nobody else handles SIGTERM, in the main thread, until the run ends."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, terminated)
    config.add_cleanup(lambda: signal.signal(signal.SIGTERM, previous))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _load(run: _Run, spec: str, *, explicit: bool) -> Loaded:
    """Load ``spec`` once per session (cached)."""
    if spec in run.loaded:
        return run.loaded[spec]
    from aiayn.conformance.run import failures
    from aiayn.environment import missing_extra
    from aiayn.implementations import registry

    try:
        if run.in_process:
            impl = registry.load(spec, device=run.device)
        else:
            from aiayn.conformance.run import boundary

            impl = boundary.load(spec, device=run.device)
            if run.config is not None and _is_controller(run.config):
                boundary.close(impl)  # its workers call it; here its declarations are read (a call starts it again)
    except registry.ImplementationNotFound as exc:
        extra = missing_extra(exc)
        if extra is not None:
            entry = Loaded(spec, error=f"cannot load {spec!r}: {extra}", skip=not explicit)
        else:
            entry = Loaded(spec, error=str(exc))
    else:
        failures.register_spec(impl, spec)
        entry = Loaded(spec, impl=impl)
    run.loaded[spec] = entry
    return entry


def _specs_for(config: pytest.Config, module: Any) -> tuple[list[str], bool]:
    """(specs, explicit) for a test module: its ``AIAYN_IMPL`` (``suite()``), else --impl/$AIAYN_IMPL, else the
    built-ins."""
    own = getattr(module, "AIAYN_IMPL", None)
    if own:
        return ([own] if isinstance(own, str) else list(own)), True
    run = config.stash[_STATE]
    if run.explicit is not None:
        return run.explicit, True
    from aiayn.implementations.registry import BUILTINS

    return list(BUILTINS), False


def loaded(config: pytest.Config) -> list[Loaded]:
    """The implementations loaded in this session (in the order they were requested)."""
    return list(config.stash[_STATE].loaded.values())


# --------------------------------------------------------------------------------------------
# parametrization


def _provided(impl: Any) -> frozenset[str]:
    from aiayn.implementations.protocol import provided_equations

    try:
        return provided_equations(impl)
    except Exception:  # a broken provides() is reported by the contract test
        return frozenset()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(_MARK)
    if marker is None:
        return
    if "impl" not in metafunc.fixturenames or "dtype" not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: an aiayn conformance test takes the arguments impl and dtype"
        )
    config = metafunc.config
    run = config.stash[_STATE]
    from aiayn.conformance.inputs import profiles

    profiles.active()  # $AIAYN_PROFILE or dev, unless --aiayn-profile chose already
    from aiayn.conformance.equations import RECORDS

    equation = marker.args[0]
    first_only = equation in RECORDS and RECORDS[equation].first_dtype_only
    mode = marker.kwargs.get("dtypes", "first" if first_only else "all")
    specs, explicit = _specs_for(config, metafunc.module)
    module_dtypes = getattr(metafunc.module, "AIAYN_DTYPES", None)
    wanted = set(config.getoption("--dtype") or module_dtypes or _DTYPES)
    entries = [_load(run, spec, explicit=explicit) for spec in specs]
    names = [entry.name for entry in entries]
    params = []
    for entry in entries:
        label = entry.name if names.count(entry.name) == 1 else entry.spec
        if entry.impl is None:
            if marker.kwargs.get("load_failures") and not entry.skip:
                params.append(pytest.param(LoadFailure(entry.spec, entry.error), "-", id=f"{label}-load"))
            else:
                why = entry.error if entry.skip else "could not be loaded (see test_declarations_follow_the_contract)"
                params.append(
                    pytest.param(
                        None, "-", id=f"{label}-unavailable", marks=pytest.mark.skip(reason=f"{entry.spec}: {why}")
                    )
                )
            continue
        impl = entry.impl
        dtypes = tuple(getattr(impl, "dtypes", ()) or ())
        _check_module_dtypes(metafunc.module, module_dtypes, entry, dtypes)
        chosen = [d for d in (dtypes[:1] if mode == "first" else dtypes) if d in wanted]
        if equation != "contract" and equation not in _provided(impl):
            params.append(
                pytest.param(
                    impl,
                    chosen[0] if chosen else "-",
                    id=f"{label}-not-provided",
                    marks=pytest.mark.skip(reason=f"{equation} not provided by {entry.name}"),
                )
            )
            continue
        if equation != "contract":
            from aiayn.implementations.protocol import scope_of

            scope = scope_of(impl, equation)
            chosen = [d for d in chosen if scope.dtypes is None or d in scope.dtypes]
            unmet = scope.unmet(tuple(marker.kwargs.get("needs", ())))
            if unmet:
                why = f"{OUT_OF_SCOPE} of {entry.name} ({scope.describe()}): the test needs {', '.join(unmet)}"
                params += [pytest.param(impl, d, id=f"{label}-{d}", marks=pytest.mark.skip(reason=why)) for d in chosen]
                continue
        params += [pytest.param(impl, d, id=f"{label}-{d}") for d in chosen]
    if not params:
        params = [
            pytest.param(
                None, "-", id="no-implementation", marks=pytest.mark.skip(reason="no implementation/dtype selected")
            )
        ]
    metafunc.parametrize(("impl", "dtype"), params)


def _check_module_dtypes(module: Any, asked: Any, entry: Loaded, declared: tuple[str, ...]) -> None:
    """``suite(..., dtypes=...)`` asks for dtypes the implementation declares, as ``--dtype`` must; else the module
    is a usage error, never a row of skips that passes."""
    if asked is None:
        return
    where = f"aiayn: suite({entry.spec!r}, dtypes={list(asked)!r}) in {module.__name__}"
    unknown = [d for d in asked if d not in _DTYPES]
    if unknown or not asked:
        raise pytest.UsageError(f"{where}: expected dtypes among {', '.join(_DTYPES)}, got {list(asked)!r}")
    missing = [d for d in asked if d not in declared]
    if missing:
        raise pytest.UsageError(
            f"{where}: {entry.name} does not declare dtype {', '.join(missing)}; it declares "
            f"{', '.join(declared) or 'none'}"
        )


def deviation_key(item: pytest.Item) -> str:
    """The name an implementation uses in ``known_deviations`` for this test.

    The test function's name without ``test_``, plus its own parameters other than the
    implementation and dtype in brackets, e.g. ``attention_poison_at_masked_positions_changes_nothing[nan_keys]``.
    """
    name = getattr(item, "originalname", item.name).removeprefix("test_")
    callspec = getattr(item, "callspec", None)
    extra = [str(v) for k, v in (callspec.params.items() if callspec else ()) if k not in ("impl", "dtype")]
    return f"{name}[{'-'.join(extra)}]" if extra else name


@functools.cache
def deviation_names() -> dict[str, frozenset[str]]:
    """Every test of the suite by the name ``known_deviations`` declarations use -> its parameters as
    :func:`deviation_key` writes them in brackets (empty: the test has none of its own).

    Read from the suite's test modules (``conformance/test_*.py``) and their ``parametrize`` marks, so that
    ``declaration_problems(impl, deviation_names())`` finds a declaration that names no test whatever part of
    the suite a run selects.
    """
    names: dict[str, frozenset[str]] = {}
    for path in sorted(Path(__file__).resolve().parent.parent.glob("test_*.py")):
        module = importlib.import_module(f"aiayn.conformance.{path.stem}")
        for attr, fn in vars(module).items():
            if attr.startswith("test_") and callable(fn):
                names[attr.removeprefix("test_")] = _parameter_ids(fn)
    return names


def _parameter_ids(fn: Any) -> frozenset[str]:
    """The bracketed part of :func:`deviation_key` for each parameter set of test function ``fn``: its values by
    ``str``, joined with ``-``, across its ``parametrize`` marks."""
    ids: list[tuple[str, ...]] = [()]
    for mark in getattr(fn, "pytestmark", ()):
        if mark.name != "parametrize":
            continue
        argnames, argvalues = mark.args[0], mark.args[1]
        several = len(argnames.split(",") if isinstance(argnames, str) else argnames) > 1
        values = [getattr(v, "values", v if several else (v,)) for v in argvalues]  # a pytest.param has .values
        ids = [head + tuple(map(str, v)) for head in ids for v in values]
    return frozenset("-".join(i) for i in ids if i)


def _is_aiayn(item: pytest.Item) -> bool:
    return item.get_closest_marker(_MARK) is not None


def _agreement_only(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--aiayn-agreement-only``: keep the aiayn tests named test_<equation>, decoding's agreement tests
    (their records' ``decode.agreement``) and the contract's; deselect the rest of the suite."""
    from aiayn.conformance.equations import RECORDS
    from aiayn.implementations.protocol import EQUATIONS

    agreement = {c for r in RECORDS.values() if r.decode is not None for c in r.decode.agreement}
    keep = {f"test_{e}" for e in EQUATIONS} | {f"test_{c}" for c in agreement}
    dropped = [
        i
        for i in items
        if _is_aiayn(i)
        and getattr(i, "originalname", i.name) not in keep
        and i.get_closest_marker(_MARK).args[:1] != ("contract",)
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in set(dropped)]


def _deselect_direction(config: pytest.Config, items: list[pytest.Item], direction: str) -> None:
    """``--aiayn-no-grad`` ("backward"), ``--aiayn-no-decode`` ("decode"): deselect the aiayn tests of that direction
    (their marker's ``direction``)."""
    dropped = [i for i in items if _is_aiayn(i) and i.get_closest_marker(_MARK).kwargs.get("direction") == direction]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in set(dropped)]


def _longest_first(items: list[pytest.Item]) -> None:
    """The suite's modules in the reverse of their order (whole-model checks, then layers, then single equations),
    other tests after them: xdist hands tests out in this order, so the longest go first and the workers end
    together rather than one waiting on the other's last whole-model check. Every worker sorts alike (xdist needs
    one order); a run without workers keeps the paper's order."""
    from aiayn.conformance import TEST_MODULES

    rank = {name: i for i, name in enumerate(reversed(TEST_MODULES))}
    items.sort(key=lambda item: rank.get(getattr(item.module, "__name__", "").rpartition(".")[2], len(rank)))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A failure the implementation declares in ``known_deviations`` is expected, strictly.

    A declaration names the test as :func:`deviation_key` does, optionally followed by
    ``@<dtype>`` to limit it to one dtype. The test still runs: if it fails it is reported as a
    known deviation (with the declared reason), and if it passes the run fails (strict), so a
    declaration cannot outlive the deviation it explains.
    """
    if config.getoption("--aiayn-agreement-only"):
        _agreement_only(config, items)
    if config.getoption("--aiayn-no-grad"):
        _deselect_direction(config, items, BACKWARD)
    if config.getoption("--aiayn-no-decode"):
        _deselect_direction(config, items, DECODE)
    if _is_worker(config):
        _longest_first(items)
    for item in items:
        if not _is_aiayn(item):
            continue
        callspec = getattr(item, "callspec", None)
        impl = callspec.params.get("impl") if callspec else None
        declared = getattr(impl, "known_deviations", None) or {}
        key, dtype = deviation_key(item), callspec.params.get("dtype") if callspec else None
        reason = (declared.get(key) or declared.get(f"{key}@{dtype}")) if hasattr(declared, "get") else None
        if reason:
            item.add_marker(
                pytest.mark.xfail(
                    strict=True, reason=f"known deviation declared by {getattr(impl, 'name', impl)}: {reason}"
                )
            )
            item.stash[_DECLARED] = True


# --------------------------------------------------------------------------------------------
# running: statistics per test, the call in flight, crashes (works under pytest-xdist)


def _worker_input(config: pytest.Config) -> dict[str, Any] | None:
    return getattr(config, "workerinput", None)


def _prepare_isolation(config: pytest.Config) -> None:
    """Before the first aiayn test of a process: the per-call time limit; in an xdist worker, also
    where to record the call in flight (after pytest's own faulthandler setup, which it overrides)."""
    run = config.stash[_STATE]
    if run.isolation_ready:
        return
    from aiayn.conformance.run import isolation

    limit = config.getoption("--aiayn-timeout")
    worker = _worker_input(config)
    isolation.configure(
        isolation.DEFAULT_LIMIT_S if limit is None else limit,
        worker=worker["workerid"] if worker else None,
        testrunuid=worker.get("testrunuid") if worker else None,
    )
    run.isolation_ready = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if not _is_aiayn(item):
        return (yield)
    from aiayn.conformance.inputs import profiles, strategies
    from aiayn.conformance.run import harness, isolation

    _prepare_isolation(item.config)

    stats = harness.Stats()
    item.stash[_STATS] = stats
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    isolation.test_started(
        {
            "nodeid": item.nodeid,
            "equation": item.get_closest_marker(_MARK).args[0],
            "spec": _spec_of(params.get("impl"), item.config) or "-",
            "dtype": params.get("dtype", "-"),
            "test": getattr(item, "originalname", item.name),
            "direction": item.get_closest_marker(_MARK).kwargs.get("direction", FORWARD),
        }
    )
    token = harness.current_stats().set(stats)
    test = item.obj  # Hypothesis reads a test's settings from the function at each call
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if own is not None and item.stash.get(_DECLARED, False):
        test._hypothesis_internal_use_settings = profiles.without_shrinking(own)
    salt = _shape_salt(item.config) if compiles_per_shape(params.get("impl")) else None
    try:
        with strategies.few_shapes(salt):
            return (yield)
    finally:
        harness.current_stats().reset(token)
        if own is not None:
            test._hypothesis_internal_use_settings = own


def compiles_per_shape(impl: Any) -> bool:
    """The implementation declares that each new input shape costs it a compile (``compiles_per_shape = True``)."""
    return getattr(impl, "compiles_per_shape", False) is True


def _shape_salt(config: pytest.Config) -> int:
    """Which few sets of sizes this run draws from (``strategies.few_shapes``): fixed under a derandomized profile,
    the Hypothesis seed's when one is given, else one per run (the same in every worker of an xdist run)."""
    from aiayn.conformance.inputs import profiles

    run = config.stash[_STATE]
    if run.shape_salt is None:
        seed = config.getoption("hypothesis_seed", None)
        worker = _worker_input(config)
        if profiles.PROFILES[profiles.active()][1]:
            run.shape_salt = 0
        elif seed is not None:
            run.shape_salt = zlib.crc32(str(seed).encode())
        elif worker and worker.get("testrunuid"):
            run.shape_salt = zlib.crc32(str(worker["testrunuid"]).encode())
        else:
            run.shape_salt = int.from_bytes(os.urandom(4), "little")
    return run.shape_salt


def _spec_of(impl: Any, config: pytest.Config) -> str | None:
    if impl is None:
        return None
    for entry in loaded(config):
        if entry.impl is impl:
            return entry.spec
    return getattr(impl, "spec", None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    callspec = getattr(item, "callspec", None)
    marker = item.get_closest_marker(_MARK)
    if callspec is None or marker is None or "impl" not in callspec.params:
        return rep
    if not (rep.when == "call" or (rep.when == "setup" and not rep.passed)):
        return rep
    from aiayn.conformance.run import harness
    from aiayn.conformance.run.isolation import CallTimedOut, ProcessCrashed

    impl = callspec.params["impl"]
    if impl is None:  # the placeholder of a selection with no implementation for this test: nothing to attribute
        return rep
    stats = item.stash.get(_STATS, None) or harness.Stats()
    stats.seconds["test"] = stats.seconds.get("test", 0.0) + rep.duration
    reason, outcome, crash = "", Outcome(rep.outcome), ""
    if hasattr(rep, "wasxfail"):  # a declared known deviation that did deviate
        reason, outcome = str(rep.wasxfail), Outcome.KNOWN_DEVIATION
    elif rep.skipped and isinstance(rep.longrepr, tuple):
        reason = str(rep.longrepr[2])
    elif rep.failed and call.excinfo is not None and call.excinfo.errisinstance(CallTimedOut):
        # a call past the time limit without workers, or a call not made because its method hung earlier
        reason, crash = str(call.excinfo.value).splitlines()[0], "timeout"
    elif rep.failed and call.excinfo is not None and call.excinfo.errisinstance(ProcessCrashed):
        # the implementation's own process ended during a call (conformance/run/boundary.py)
        reason, crash = str(call.excinfo.value).splitlines()[0], call.excinfo.value.cause
    elif rep.failed and call.excinfo is not None:  # the failure's first line: what was found, or what broke
        reason = (str(call.excinfo.value).strip().splitlines() or [call.excinfo.typename])[0]
    result = stats.result(
        spec=_spec_of(impl, item.config) or getattr(impl, "spec", "-"),
        equation=marker.args[0],
        direction=marker.kwargs.get("direction", FORWARD),
        dtype=callspec.params.get("dtype", "-"),
        test=getattr(item, "originalname", item.name),
        nodeid=item.nodeid,
        outcome=outcome,
        reason=reason,
        crash=crash,
    )
    rep.user_properties.append(("aiayn", result.to_dict()))  # plain data: it crosses from an xdist worker
    if rep.when == "call":
        _forget_unnamed_replays(stats.files, rep.longreprtext if rep.failed or hasattr(rep, "wasxfail") else "")
    return rep


def _forget_unnamed_replays(files: list[str], message: str) -> None:
    """Delete the replay files of this test that no failure message names (Hypothesis's intermediate examples)."""
    for path in files:
        if path not in message:
            Path(path).unlink(missing_ok=True)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodeready(node: Any) -> None:
    """(xdist, on the controller) remember the run's uid, to find and remove the workers' records."""
    config = node.config
    if _STATE in config.stash:
        config.stash[_STATE].testrunuids.add(node.workerinput["testrunuid"])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """(xdist, on the controller) In a run that asked for aiayn's checks, xdist's load scheduling with one change:
    tests sent to a worker that has died, before xdist has seen it die, do not end the run.

    Handling one worker's death, xdist hands that worker's remaining tests to the others at once. When another worker
    died too and xdist has not yet read its end (two checks hung together, as the first tests of both workers do on a
    hanging implementation: the time limit ends both within milliseconds, and on a loaded machine the thread that
    reads the second worker's end runs after the main loop), pytest-xdist 3.8 writes to the dead worker, the send
    raises OSError, and the session ends in an INTERNALERROR before any check is reported: no report. Here the
    tests stay assigned to the dead worker, and its death, handled next, hands them on (and fails its crashed check).
    """
    if _STATE not in config.stash or config.stash[_STATE].explicit is None or config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScheduling

    class DeathTolerantScheduling(LoadScheduling):
        def _send_tests(self, node: Any, num: int) -> None:
            try:
                super()._send_tests(node, num)  # adds the tests to the node's pending list, then sends them
            except OSError:
                pass  # the node is dead: xdist's worker_errordown re-queues its pending tests when it handles the death

    return DeathTolerantScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """(xdist, on the controller) a worker died inside a check: make it that check's failure, with its replay file."""
    node = getattr(report, "node", None)
    if node is None or _STATE not in node.config.stash:
        return
    from aiayn.conformance.run import isolation

    workerinput = node.workerinput
    record = isolation.crash_record(workerinput["testrunuid"], workerinput["workerid"], crashitem)
    if record is None:
        return
    message, replay = _crash_message(record)
    if record["cause"] == "timeout":  # before xdist starts the replacement worker: no worker calls the method again
        isolation.mark_hung(workerinput["testrunuid"], record, replay)
    report.longrepr = message
    node.config.stash[_STATE].crashes.append(crashitem)
    crashed = TestResult(
        spec=record.get("spec", "-"),
        equation=record.get("equation", "-"),
        direction=_crash_direction(record),
        dtype=record.get("dtype", "-"),
        test=record.get("test", crashitem),
        outcome=Outcome.FAILED,
        nodeid=crashitem,
        reason=message.splitlines()[0],
        crash=record["cause"],
        replay=replay,
    )
    report.user_properties.append(("aiayn", crashed.to_dict()))


def _crash_direction(record: dict[str, Any]) -> str:
    """The direction of the test a worker died in, as its record names it (``pytest_runtest_call`` writes it before
    the test starts): a hang in ``beam_search`` is a failure of the decode row, not of the forward one."""
    direction = record.get("direction")
    # a record without one was written by no test of this run's plugin (pytest_runtest_call writes every record):
    # the crash stays a failure, filed under the equation's forward row, the row every equation has
    return direction if direction in DIRECTIONS else FORWARD


def _crash_message(record: dict[str, Any]) -> tuple[str, str | None]:
    from aiayn.conformance.equations import title as equation_title
    from aiayn.conformance.run.failures import failure_name
    from aiayn.environment import failure_dir

    title = equation_title(record.get("equation", "?"))
    call = record.get("call") or "the test (outside any call into the implementation)"
    cause = record["cause"]
    if cause == "timeout":
        what = (
            f"{call} did not return within {record.get('limit_s', 0):g} s "
            "(the per-call time limit; aiayn check --timeout)"
        )
        if record.get("method"):
            what += f"; later calls of {record['method']} fail at once"
    elif cause == "exited":
        what = f"the worker process ended during {call} without a Python error (killed, e.g. for memory, or os._exit)"
    else:
        what = f"the worker process crashed during {call} ({cause})"
    replay = None
    if record.get("inputs_file"):
        tag = hashlib.sha256(record["nodeid"].encode()).hexdigest()[:10]
        target = failure_dir() / failure_name(
            record.get("spec", "impl").replace(":", "_"),
            record.get("check", "check"),
            f"{record.get('dtype', '-')}-crash-{tag}",
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record["inputs_file"], target)
        replay = str(target)
    lines = [
        f"{title}: {what}",
        f"  implementation {record.get('spec')}, dtype {record.get('dtype')}; test {record.get('test')}"
        + (f", check {record['check']}" if record.get("check") else ""),
    ]
    if record.get("inputs"):
        lines.append(f"  inputs: {record['inputs']}")
    if replay:
        lines.append(
            f"  replay: aiayn replay {replay}   "
            f"(in this process: expect the same {'hang' if cause == 'timeout' else 'crash'})"
        )
    frames = _main_thread_frames(record.get("traceback") or "")
    if frames:
        lines += ["  where (faulthandler, most recent call first):", *[f"    {line.strip()}" for line in frames[:8]]]
    return "\n".join(lines), replay


def _main_thread_frames(dump: str) -> list[str]:
    """The frames of the thread that was running the check, from a faulthandler dump (execnet's I/O threads left
    out)."""
    blocks: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([line])
        elif blocks and line.strip().startswith("File "):
            blocks[-1].append(line)
    current = [b for b in blocks if b[0].startswith("Current thread")]
    mine = current or [b for b in blocks if not any("execnet" in line for line in b[1:])]
    return mine[0][1:] if mine else []


class _Results:
    """Collects the session's results into its :class:`_Run` as each test's report arrives (from this process or,
    under xdist, from a worker): registered as a plugin of its own at configure, because pytest hands
    ``pytest_runtest_logreport`` the report alone."""

    def __init__(self, run: _Run) -> None:
        self.run = run

    @pytest.hookimpl(trylast=True)  # after the terminal reporter's progress character
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == "aiayn" and isinstance(value, dict):
                result = TestResult.from_dict(value)
                self.run.results.append(result)
                if result.outcome is Outcome.FAILED:
                    _say_failure(self.run, result)


def _say_failure(run: _Run, result: TestResult) -> None:
    """One line as soon as a check fails (under workers pytest shows the tracebacks only when the run ends)."""
    config = run.config
    terminal = config.pluginmanager.get_plugin("terminalreporter") if config is not None else None
    if terminal is None or _is_worker(config):
        return
    from aiayn.conformance.report.rows import failure_reason

    if getattr(getattr(terminal, "_tw", None), "width_of_current_line", 1):  # after progress characters
        terminal.write("\n")
    terminal.write_line(f"aiayn: FAILED {result.nodeid or result.test}: {failure_reason(result)}", red=True)


def _is_worker(config: pytest.Config) -> bool:
    return _worker_input(config) is not None


def _is_controller(config: pytest.Config) -> bool:
    """This process hands the tests to pytest-xdist's workers (``-n N``, N > 0) and runs none itself."""
    workers = config.getoption("numprocesses", None)
    return bool(workers) and workers != "0" and not _is_worker(config)


def _report_names(run: _Run, specs: list[str]) -> dict[str, str]:
    """spec -> the name its report files carry: the implementation's name, made distinct where two implementations
    of one run share it (the later ones get their spec appended)."""
    names: dict[str, str] = {}
    for spec in dict.fromkeys(specs):
        entry = run.loaded.get(spec)
        name = entry.name if entry is not None else spec
        names[spec] = name if name not in names.values() else f"{name}-{spec}"
    return names


def _write_report(
    directory: Path, entry: Loaded, results: list[TestResult], config: pytest.Config, names: dict[str, str]
) -> list[str]:
    """Write one implementation's report; a write that fails keeps the results: the report goes to a temporary
    folder instead, and the lines say where."""
    import tempfile
    import types

    from aiayn.conformance.report import rows as report

    named = types.SimpleNamespace(
        spec=entry.spec, impl=entry.impl, error=entry.error, skip=entry.skip, name=names.get(entry.spec, entry.name)
    )
    force = config.getoption("--aiayn-force")
    cut = config.stash[_STATE].interrupted
    try:
        paths = report.write(directory, named, results, run_info(config), force=force, interrupted=cut)
        return [
            f"wrote {path.resolve()}" + (" (a partial report: the run was interrupted)" if cut else "")
            for path in paths
        ]
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix="aiayn-report-"))
        paths = report.write(fallback, named, results, run_info(config), force=True, interrupted=cut)
        return [f"could not write the report into {directory} ({exc.strerror or exc}); wrote it to {paths[0].parent}"]


def _nothing_checked(config: pytest.Config, results: list[TestResult]) -> str:
    """Why this run checked nothing although it was asked to (empty when something was checked or nobody asked)."""
    run = config.stash[_STATE]
    if any(r.counted for r in results):
        return ""
    if results:
        reasons = sorted({r.reason for r in results if r.reason})
        return f"no check ran: all {len(results)} selected aiayn tests were skipped" + (
            f" ({'; '.join(reasons[:3])}{' ...' if len(reasons) > 3 else ''})" if reasons else ""
        )
    if run.explicit is not None:
        return "no check ran: --impl was given but the selection holds no aiayn test (check the paths, -k and -m)"
    return ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _STATE not in config.stash or _is_worker(config):
        return
    run = config.stash[_STATE]
    run.interrupted = int(exitstatus) == pytest.ExitCode.INTERRUPTED
    from_run = run.results
    if (from_run or run.explicit is not None) and not run.interrupted:
        why = _nothing_checked(config, from_run)
        if why and int(exitstatus) in (0, 5):
            run.usage_error = why
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
    directory = config.getoption("--aiayn-report")
    if from_run:
        from aiayn.conformance.report import rows as report

        names = _report_names(run, [r.spec for r in from_run])
        for spec in dict.fromkeys(r.spec for r in from_run):
            entry = run.loaded.get(spec) or _load(run, spec, explicit=True)
            if entry.skip:  # an optional dependency is missing: nothing to report, and no committed report to overwrite
                continue
            mine = [r for r in from_run if r.spec == spec]
            rows = [Row.from_dict(r) for r in report.build(entry, mine, run_info(config))["rows"]]
            run.inconclusive += [
                f"{entry.name}: {r.section} [{r.dtype}]: "
                + (
                    f"{r.not_checked:,} of {r.checked + r.not_checked:,} elements not checked (stated maximum "
                    f"{100 * r.max_unchecked:g}%): "
                    + "; ".join(f"{n:,} {why}" for why, n in sorted(r.not_checked_reasons.items(), key=lambda x: -x[1]))
                    if r.checked + r.not_checked
                    else f"its tests ({', '.join(r.tests)}) passed without comparing a single element"
                )
                for r in rows
                if r.status is Status.INCONCLUSIVE
            ]
            if directory:
                run.written += _write_report(Path(directory), entry, mine, config, names)
        if run.inconclusive and int(session.exitstatus) == 0:  # an interrupted run keeps its exit status, 2
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if directory and run.explicit is not None:
        _say_unwritten(session, run, Path(directory), {r.spec for r in from_run})
    for uid in run.testrunuids:
        from aiayn.conformance.run import isolation

        isolation.remove(uid)


def _say_unwritten(session: pytest.Session, run: _Run, directory: Path, reported: set[str]) -> None:
    """A report asked for (``--aiayn-report``) and not written, because no check of that implementation finished:
    one line that says so and how the run ended, printed now (pytest prints no summary after an INTERNALERROR), and
    never exit 0."""
    missing = [s for s in run.explicit or () if s not in reported and not (s in run.loaded and run.loaded[s].skip)]
    if missing and int(session.exitstatus) == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    status = int(session.exitstatus)
    how = next((code.name for code in pytest.ExitCode if code == status), "")
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    for spec in missing:
        line = (
            f"ERROR: aiayn: no report of {spec} written into {directory}: no check of it finished before the run "
            f"ended (exit {status} {how}; see above)"
        )
        if terminal is not None:
            terminal.write_line(line, red=True, bold=True)
        else:
            print(line, file=sys.stderr)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _STATE not in config.stash or _is_worker(config):
        return
    run = config.stash[_STATE]
    results = run.results
    if results:
        from aiayn.conformance.report import rows as report

        terminalreporter.section(
            "aiayn conformance: per equation" + (" (INTERRUPTED: the tests that ended)" if run.interrupted else "")
        )
        for spec in dict.fromkeys(r.spec for r in results):
            entry = run.loaded.get(spec) or Loaded(spec)
            for line in report.summary_lines(entry, [r for r in results if r.spec == spec]):
                terminalreporter.write_line(line)
        failures = [r for r in results if r.outcome is Outcome.FAILED]
        if failures:
            from aiayn.environment import failure_dir

            terminalreporter.write_line(f"inputs of failed checks: {failure_dir()} (replay one: aiayn replay FILE)")
        for line in run.written:
            terminalreporter.write_line(line, red=line.startswith("could not"))
    for line in run.inconclusive:
        terminalreporter.write_line(
            f"INCONCLUSIVE: aiayn: {line}; not declared by the implementation (declared_inconclusive), "
            "so the run fails",
            red=True,
            bold=True,
        )
    if run.usage_error:
        terminalreporter.write_line(f"ERROR: aiayn: {run.usage_error} (exit 4)", red=True, bold=True)
    if run.interrupted and results:
        terminalreporter.write_line(
            f"INTERRUPTED: aiayn: the run was interrupted after {len(results)} tests: no verdict (exit 2); the rows "
            "above are partial, and a report is written only under a name that ends in -INTERRUPTED",
            red=True,
            bold=True,
        )


# --------------------------------------------------------------------------------------------
# the header


def run_info(config: pytest.Config) -> dict[str, str]:
    """Profile, seed and examples per test of this run (for the header and the reports' signature)."""
    from aiayn.conformance.inputs import profiles

    name = profiles.active()
    seed = config.getoption("hypothesis_seed", None)
    examples, derandomized = profiles.PROFILES[name]
    if seed is None:
        seed = "derandomized" if derandomized else "random"
    chosen = [f"-k {config.getoption('keyword')}"] if config.getoption("keyword", None) else []
    chosen += [f"dtypes {', '.join(config.getoption('--dtype'))}"] if config.getoption("--dtype", None) else []
    chosen += ["agreement tests only"] if config.getoption("--aiayn-agreement-only", False) else []
    chosen += ["no gradients"] if config.getoption("--aiayn-no-grad", False) else []
    chosen += ["no decoding"] if config.getoption("--aiayn-no-decode", False) else []
    return {"profile": name, "seed": str(seed), "max_examples": str(examples), "selection": "; ".join(chosen)}


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash[_STATE]
    if run.explicit is None:
        return []
    from aiayn.conformance.inputs.strategies import FEW_SHAPES
    from aiayn.conformance.run.boundary import Remote, flushes, isolation

    info = run_info(config)
    lines = [
        f"aiayn conformance: profile {info['profile']} ({info['max_examples']} examples per test), seed {info['seed']}"
    ]
    wanted = config.getoption("--dtype") or []
    for entry in loaded(config):
        if entry.impl is None:
            lines.append(
                f"  {entry.spec}: {'skipped' if entry.skip else 'NOT LOADED'} "
                f"({entry.error.splitlines()[0] if entry.error else ''})"
            )
            continue
        impl = entry.impl
        dtypes = [d for d in impl.dtypes if not wanted or d in wanted]
        lines.append(
            f"  {impl.name} ({impl.version}) on {impl.device}, dtypes {', '.join(dtypes) or 'none selected'}"
            + ("" if entry.spec == impl.name else f" [{entry.spec}]")
            + (f"; compiles per shape: sizes from {FEW_SHAPES} sets per strategy" if compiles_per_shape(impl) else "")
        )
        if flushes(impl) or not isinstance(impl, Remote):
            lines.append(f"    runs {isolation(impl)}")
    return lines
