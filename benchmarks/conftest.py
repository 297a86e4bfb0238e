"""pytest configuration of the benchmark suite: options, the case matrix, the session's measurements.

Run with ``aiayn bench`` (``make bench``), which runs this folder under pytest with one thread,
then writes the reports; ``aiayn bench --from-run RUN.json`` writes the report of an earlier run.

Options (all ``--bench-*``; lists are comma-separated) choose the implementations, dtypes, sizes
and threads; ``--bench-smoke`` selects the seconds-long subset that CI runs. Every case records
a GEMM ceiling measured right before and right after its rounds, and the run divides every case
by the best GEMM ceiling of the session (``measure.apply_session_ceiling``); every run records in
its JSON (key ``"aiayn"``) the session's GEMM ceilings at its start and again at its end (the
drift), the thread pools threadpoolctl sees (library, version, kernel, threads), the BLAS
environment variables, and the load average.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from aiayn.benchmarks import cases as C
from aiayn.benchmarks import measure as M

_SESSION_KEY = pytest.StashKey["BenchSession"]()


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiayn benchmarks")
    add = group.addoption
    add(
        "--bench-smoke",
        action="store_true",
        help="the CI subset: n=128 (and 1024 on the O(n)-memory paths), one round, small GEMM",
    )
    add(
        "--bench-threads",
        type=int,
        default=1,
        help="threads for every BLAS/OpenMP pool and torch (default 1: reproducible on small VMs)",
    )
    add(
        "--bench-impls",
        type=_str_list,
        default=C.BUILTIN_IMPLS,
        help="implementations: registry names or module:attr (default: the four built-ins)",
    )
    add(
        "--bench-big-impls",
        type=_str_list,
        default=C.MEMORY_BOUNDED_IMPLS,
        help="implementations also run at --bench-big-sizes (every pass)",
    )
    add("--bench-dtypes", type=_str_list, default=C.DTYPES, help="dtypes (default float32,float64)")
    add("--bench-masks", type=_str_list, default=C.MASKS, help="masks: full, causal (default both)")
    add(
        "--bench-passes",
        type=_str_list,
        default=tuple(C.PASSES),
        help="passes of Eq. (1) to time: forward, backward, forward+backward (default all three)",
    )
    add(
        "--bench-sizes",
        type=_int_list,
        default=None,
        help=f"sequence lengths n (default {','.join(map(str, C.FULL_SIZES))})",
    )
    add(
        "--bench-big-sizes",
        type=_int_list,
        default=None,
        help=f"extra n for --bench-big-impls (default {','.join(map(str, C.BIG_SIZES))})",
    )
    add(
        "--bench-stages",
        type=_str_list,
        default=None,
        help="dtype:n pairs for the NumPy stage breakdown (default: float32 at every n of the run)",
    )
    add(
        "--bench-gemm-n",
        type=int,
        default=None,
        help="edge of the square GEMM that measures the ceiling (default 2048)",
    )
    add("--bench-gemm-repeats", type=int, default=None, help="timed GEMM calls per ceiling, best kept (default 5)")
    add(
        "--bench-adjacent-repeats",
        type=int,
        default=None,
        help="GEMM calls right before and right after each case (default 3)",
    )
    add("--bench-budget", type=float, default=None, help="seconds of timed rounds per case (default 2.0)")
    add(
        "--bench-min-rounds",
        type=int,
        default=None,
        help="fewest timed rounds per case (default 10: two samples of 10 rounds let the regression test reach "
        "p = 1/184756, far below its threshold; samples of 5 cannot reach 0.002)",
    )
    add("--bench-max-rounds", type=int, default=50, help="most timed rounds per case (default 50)")
    add(
        "--bench-training-step",
        default=None,
        metavar="MODULE:ATTR",
        help=(
            "our training-step factory (aiayn bench passes aiayn.reproductions.translation.bench:training_step); "
            "without it only the nn.Transformer peer's training cases run"
        ),
    )
    add(
        "--bench-training",
        type=_str_list,
        default=("cpu", "base"),
        help="training-throughput configurations (cpu, base; empty: none); --bench-smoke uses a tiny one",
    )


@dataclass
class BenchSession:
    """The run's settings and what it measured once for all cases (ceilings, implementations)."""

    threads: int
    smoke: bool
    gemm_n: int
    gemm_repeats: int
    adjacent_repeats: int
    budget_s: float
    min_rounds: int
    max_rounds: int
    ceilings: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    impls: dict[str, Any] = field(default_factory=dict)
    training_step: str | None = None
    threadpoolctl: bool = False
    start: dict[str, Any] = field(default_factory=dict)

    def apply_threads(self) -> None:
        """(Re)apply the thread limit: libraries loaded since the last call are covered too."""
        self.threadpoolctl = M.limit_threads(self.threads)

    def implementation(self, spec: str) -> Any:
        """The implementation ``spec`` names, loaded once; skip the case if its library is missing."""
        if spec not in self.impls:
            from aiayn.implementations.registry import ImplementationNotFound, load

            try:
                self.impls[spec] = load(spec)
            except ImplementationNotFound as exc:
                if isinstance(exc.__cause__, ModuleNotFoundError):
                    self.impls[spec] = exc
                else:
                    raise
        impl = self.impls[spec]
        if isinstance(impl, Exception):
            pytest.skip(f"implementation {spec!r} cannot be imported here: {impl.__cause__}")
        return impl

    def ceiling(self, library: str, dtype: str, device: str) -> dict[str, Any]:
        """The GEMM ceiling of ``library``/``dtype`` on ``device``, measured on first use."""
        key = (library, dtype, device)
        if key not in self.ceilings:
            self.apply_threads()
            gemm_library = library if library in ("numpy", "torch") else "numpy"
            self.ceilings[key] = M.gemm_ceiling(gemm_library, dtype, self.gemm_n, self.gemm_repeats, device)
        return self.ceilings[key]

    def adjacent_ceiling(self, library: str, dtype: str, device: str) -> float:
        """Best GFLOP/s of ``adjacent_repeats`` GEMM calls now (no warm-up: the session's ceiling warmed it).

        A case measures this right before and right after its timed rounds; the better of the two is
        the ceiling its ratios use, so that the case and its ceiling see the same load.
        """
        self.ceiling(library, dtype, device)  # the session record (and the warm-up)
        gemm_library = library if library in ("numpy", "torch") else "numpy"
        return M.gemm_ceiling(gemm_library, dtype, self.gemm_n, self.adjacent_repeats, device, warmup=False)["gflops"]

    def rounds(self, first_call_s: float) -> int:
        """Timed rounds for a case whose warm-up call took ``first_call_s``: fill the time budget."""
        wanted = math.ceil(self.budget_s / max(first_call_s, 1e-9))
        return max(self.min_rounds, min(self.max_rounds, wanted))


def _option(config: pytest.Config, name: str, full: Any, smoke: Any) -> Any:
    value = config.getoption(name)
    if value is not None:
        return value
    return smoke if config.getoption("--bench-smoke") else full


def pytest_configure(config: pytest.Config) -> None:
    smoke = config.getoption("--bench-smoke")
    threads = config.getoption("--bench-threads")
    if threads < 1:
        raise pytest.UsageError(f"--bench-threads: expected a positive int, got {threads}")
    session = BenchSession(
        threads=threads,
        smoke=smoke,
        gemm_n=_option(config, "--bench-gemm-n", 2048, C.SMOKE.gemm_n),
        gemm_repeats=_option(config, "--bench-gemm-repeats", 5, 1),
        adjacent_repeats=_option(config, "--bench-adjacent-repeats", 3, 1),
        budget_s=_option(config, "--bench-budget", 2.0, 0.0),
        min_rounds=_option(config, "--bench-min-rounds", 10, 1),
        max_rounds=config.getoption("--bench-max-rounds"),
        training_step=config.getoption("--bench-training-step"),
    )
    session.apply_threads()
    session.start = {"loadavg": list(os.getloadavg()), "blas_env": M.blas_env()}
    config.stash[_SESSION_KEY] = session


@pytest.fixture(scope="session")
def bench(request: pytest.FixtureRequest) -> BenchSession:
    """The run's :class:`BenchSession`."""
    return request.config.stash[_SESSION_KEY]


def _stage_pairs(config: pytest.Config) -> list[tuple[str, int]]:
    """The (dtype, n) of the NumPy stage breakdown: ``--bench-stages``, else float32 at every length of the run (its
    sizes and big sizes), so that each built-in's fraction of its floors is known at every n it runs."""
    lengths = {
        *_option(config, "--bench-sizes", C.FULL_SIZES, C.SMOKE.sizes),
        *_option(config, "--bench-big-sizes", C.BIG_SIZES, C.SMOKE.big_sizes),
    }
    pairs = config.getoption("--bench-stages")
    if pairs is None:
        pairs = [f"float32:{n}" for n in sorted(lengths)]
    out = []
    for pair in pairs:
        dtype, _, n = pair.partition(":")
        if dtype not in ("float32", "float64") or not n.isdigit():
            raise pytest.UsageError(f"--bench-stages: expected dtype:n pairs such as float32:2048, got {pair!r}")
        out.append((dtype, int(n)))
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if "case" in metafunc.fixturenames:
        impls = config.getoption("--bench-impls")
        try:
            cases = C.build_cases(
                impls,
                config.getoption("--bench-dtypes"),
                _option(config, "--bench-sizes", C.FULL_SIZES, C.SMOKE.sizes),
                _option(config, "--bench-big-sizes", C.BIG_SIZES, C.SMOKE.big_sizes),
                config.getoption("--bench-big-impls"),
                masks=config.getoption("--bench-masks"),
                passes=config.getoption("--bench-passes"),
            )
        except ValueError as exc:
            raise pytest.UsageError(f"--bench-{exc}") from None
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])
    if "training_case" in metafunc.fixturenames or "memory_case" in metafunc.fixturenames:
        from aiayn.benchmarks.training import memory_cases, training_cases

        names = config.getoption("--bench-training")
        smoke = config.getoption("--bench-smoke")
        if "training_case" in metafunc.fixturenames:
            cases = training_cases(names, smoke) if (names or smoke) else []
            metafunc.parametrize("training_case", cases, ids=[c.id for c in cases])
        else:
            cases = memory_cases(smoke) if (names or smoke) else []
            metafunc.parametrize("memory_case", cases, ids=[c.id for c in cases])
    if "stage" in metafunc.fixturenames:
        from aiayn.benchmarks.stages import STAGES, StageCase, layout_fits

        stages = [
            StageCase(dtype, n, layout, name)
            for dtype, n in _stage_pairs(config)
            for layout, name in STAGES
            if layout_fits(layout, dtype, n)
        ]
        metafunc.parametrize("stage", stages, ids=[s.id for s in stages])


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def host() -> str:
    """This host's identity, strong enough to tell two VMs of one kind apart (ratios to the GEMM ceiling move by tens
    of percent between them): a digest of the machine id, the boot id and the host name, each as read here ("" where
    unreadable). A reboot makes another host: the VM may come back on other hardware."""
    parts = []
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path, encoding="ascii") as fh:
                parts.append(fh.read().strip())
        except (OSError, UnicodeDecodeError):
            parts.append("")
    parts.append(platform.node())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _cuda_devices() -> list[str]:
    """Names of the CUDA devices torch sees (empty when torch is not loaded or sees none)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def libraries() -> dict[str, str]:
    """The array libraries loaded in this run, each with its version and, for NumPy, its BLAS build: what a
    ratio depends on besides the code under test (``verdict.incompatible`` refuses a baseline where they differ).
    The implementations' own versions are not here: the code under test may change between runs."""
    out = {}
    for name in ("numpy", "torch", "jax", "jaxlib", "tensorflow", "cupy"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = str(getattr(module, "__version__", "?"))
    blas = [
        f"{p.get('internal_api')} {p.get('version')} {p.get('architecture')}"
        for p in M.threadpool_report()
        if p.get("user_api") == "blas"
    ]
    if blas:
        out["blas"] = "; ".join(sorted(set(blas)))
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda)
    return out


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: list[Any], output_json: dict[str, Any]) -> None:
    """Add the run's own record (key ``"aiayn"``), with every session ceiling measured again at the end.

    The start and end ceilings are a drift check (how much the machine's speed moved during the
    run); every case's ratios are then taken against the session ceiling (``measure.apply_session_ceiling``).
    """
    session: BenchSession = config.stash[_SESSION_KEY]
    session.apply_threads()
    ends = [
        M.gemm_ceiling(c["library"], c["dtype"], c["n"], session.gemm_repeats, c["device"])
        for c in session.ceilings.values()
    ]
    best = {
        key: max(start["gflops"], end["gflops"])
        for (key, start), end in zip(session.ceilings.items(), ends, strict=True)
    }
    best = M.apply_session_ceiling(output_json.get("benchmarks", []), best)
    output_json["aiayn"] = {
        "threads": session.threads,
        "smoke": session.smoke,
        "threadpoolctl": session.threadpoolctl,
        "threadpools": M.threadpool_report(),
        "blas_env": session.start["blas_env"],
        "cpu_model": _cpu_model(),
        "host": host(),
        "cpu_count": os.cpu_count(),
        "cuda_devices": _cuda_devices(),
        "libraries": libraries(),
        "loadavg_start": session.start["loadavg"],
        "loadavg_end": list(os.getloadavg()),
        "gemm_n": session.gemm_n,
        "ceilings_start": list(session.ceilings.values()),
        "ceilings_end": ends,
        "ceilings_best": [{"library": k[0], "dtype": k[1], "device": k[2], "gflops": v} for k, v in best.items()],
        "budget_s": session.budget_s,
        "min_rounds": session.min_rounds,
        "max_rounds": session.max_rounds,
        "gemm_repeats": session.gemm_repeats,
        "training_step": session.training_step,
        "adjacent_repeats": session.adjacent_repeats,
        "implementations": {
            name: {"version": impl.version, "device": impl.device}
            for name, impl in session.impls.items()
            if not isinstance(impl, Exception)
        },
    }
