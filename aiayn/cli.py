"""aiayn: one command for the conformance suite, the reproductions, the training run and the benchmarks.

    aiayn check SPEC [SPEC ...]     check an implementation against the paper, equation by equation
    aiayn list                      the implementations aiayn knows (built-ins, entry points), with versions
    aiayn replay FILE [FILE ...]    rerun a failed check from its saved inputs
    aiayn reproduce [NAME ...]      regenerate the paper's tables and worked numbers into reports
    aiayn train --preset NAME       train, decode and score the paper's model (the BLEU reproduction)
    aiayn train-report RUN ...      one bleu-training report from finished training runs
    aiayn ablation                  Table 3's variations at CPU scale
    aiayn bench [SPEC ...]          attention throughput as a fraction of this machine's GEMM ceiling; --baseline gates
    aiayn bench-noise               the gate's false-regression and detection rates on this machine
    aiayn mutants                   the suite against deliberately broken implementations (must catch all)
    aiayn false-alarms              the suite on correct implementations over many seeds (must raise none)
    aiayn zoo [NAME ...]            popular libraries through thin adapters, one report row each

Exit status, by pytest's conventions: 0 success; 1 a check failed (or a mutant escaped); 2 interrupted
(SIGINT or SIGTERM: no verdict; aiayn check writes a partial report only under a name ending in
-INTERRUPTED); 4 a usage error: a bad option, an implementation that cannot be loaded, a dtype it
does not declare, a selection in which nothing was checked, a missing optional dependency (named
with the extra that installs it) or an unreadable file.

Only the chosen command's modules are imported (aiayn --help needs no torch).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from aiayn import __version__
from aiayn.environment import (
    MissingExtra,
    UsageError,
    add_output_arguments,
    check_range,
    check_work_dirs,
    missing_extra,
    out_dir,
    writable_dir,
)

__all__ = ["COMMANDS", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 4


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written; every option's default shown, once (a help that states its own default keeps it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        return text if "default:" in text else super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with pytest's exit status for a usage error (4, not argparse's 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# --------------------------------------------------------------------------------------------
# aiayn check


def _add_check(p: argparse.ArgumentParser) -> None:
    from aiayn.conformance.inputs.profiles import PROFILES
    from aiayn.conformance.run.isolation import DEFAULT_LIMIT_S
    from aiayn.conformance.run.runner import default_workers
    from aiayn.implementations.protocol import DTYPES

    p.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC",
        help="implementation: a built-in or entry-point name (aiayn list), or module:attr of your own",
    )
    p.add_argument(
        "--dtype",
        action="append",
        default=[],
        choices=DTYPES,
        help="check only this dtype (repeatable); default every dtype the implementation declares",
    )
    p.add_argument(
        "--profile",
        choices=list(PROFILES),
        default=os.environ.get("AIAYN_PROFILE") or "dev",
        help="examples per check: "
        + ", ".join(f"{k} {n}{' derandomized' if d else ''}" for k, (n, d) in PROFILES.items()),
    )
    p.add_argument(
        "--device",
        default=None,
        help="place the implementations on this device (e.g. cuda); reports then read "
        "conformance-<name>-<device>.*; default: each implementation's own",
    )
    p.add_argument("--report", metavar="DIR", default=None, help="also write conformance-<name>.md and .json into DIR")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a report in DIR of larger scope (default: a smaller run, e.g. -k or --profile smoke, "
        "writes beside it under a name that says its scope)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="worker processes of the suite (0: the suite in this process). The implementation runs in a process of "
        "its own either way, so a crash, a hang or a process exit (os._exit, any code) in it fails one check, with "
        "its replay file, and the run goes on. With --in-process and 0 workers, a segfault, a hang in C code or "
        "os._exit ends the whole run at once, with no report and whatever exit status the implementation chose",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_LIMIT_S,
        help="time limit of one call into the implementation, seconds (0: none). A hang is paid once per method: "
        "after a call of a method runs past the limit, every later call of that method (any dtype) fails at once, "
        "naming the first hang and its replay file. A worker has one call in flight, so each worker pays at most one "
        "limit per method that hangs: a hanging implementation adds at most (methods that hang) x (workers) x limit "
        "of worker time, plus a worker restart per limit paid (--workers 0: (methods that hang) x limit)",
    )
    p.add_argument(
        "-k", dest="keyword", default=None, metavar="EXPR", help="only the tests matching this pytest -k expression"
    )
    p.add_argument(
        "--no-grad",
        action="store_true",
        help="skip the gradient checks (by default an implementation's gradients are checked wherever it gives them: "
        "its own vjp method, PyTorch autograd or jax.vjp)",
    )
    p.add_argument(
        "--no-decode",
        action="store_true",
        help="skip the decoding checks (by default cached decoding and beam search are checked wherever the "
        "implementation provides them: encode, decode_step, reorder_cache, beam_search)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="Hypothesis seed (default: random, or fixed by a derandomized profile)"
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="load the implementation into aiayn's own process, for a debugger (default: a process of its own behind "
        "the contract, which its code cannot reach aiayn's judge from); the report then says the verdict was not "
        "isolated",
    )
    p.epilog = (
        "More pytest options go after --, e.g. aiayn check numpy -- -x -v. Exit status: 0 every check passed; 1 a "
        "check failed or a row is inconclusive; 2 interrupted (SIGINT or SIGTERM): no verdict, and a report only "
        "under conformance-<name>-INTERRUPTED.*, never under the main name; 4 a usage error (one line says why)"
    )


def _check(args: argparse.Namespace) -> int:
    import pytest

    from aiayn.conformance.run.runner import pytest_arguments

    _check_profile(args.profile)
    check_range("--workers", args.workers, least=0)
    check_range("--timeout", args.timeout, least=0)
    _check_keyword(args.keyword)
    if args.report is not None:
        writable_dir(args.report, "--report")
    check_work_dirs()
    extra = args.pytest_args
    return int(
        pytest.main(
            pytest_arguments(
                args.specs,
                dtypes=args.dtype,
                profile=args.profile,
                report=args.report,
                workers=args.workers,
                timeout=args.timeout,
                keyword=args.keyword,
                seed=args.seed,
                device=args.device,
                force=args.force,
                no_grad=args.no_grad,
                no_decode=args.no_decode,
                in_process=args.in_process,
                extra=extra,
            )
        )
    )


def _check_profile(profile: str) -> None:
    """A profile name that came from ``$AIAYN_PROFILE`` (argparse checks only the names given as --profile)."""
    from aiayn.conformance.inputs.profiles import PROFILES

    if profile not in PROFILES:
        raise UsageError(f"$AIAYN_PROFILE: {profile!r} is not a profile; expected one of {', '.join(PROFILES)}")


def _check_keyword(expression: str | None) -> None:
    """A -k expression parsed once, here, before any worker starts (a bad one would stop every worker)."""
    if not expression:
        return
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # pytest moved its parser: pytest itself reports a bad expression
        return
    try:
        Expression.compile(expression)
    except Exception as exc:  # SyntaxError from pytest 8.4 on, ParseError before
        why = getattr(exc, "msg", None) or getattr(exc, "message", None) or str(exc)
        raise UsageError(f"-k: {expression!r} is not a pytest -k expression ({why})") from None


# --------------------------------------------------------------------------------------------
# aiayn list, aiayn replay


def _add_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-load", action="store_true", help="list the names without importing the implementations")


def _list(args: argparse.Namespace) -> int:
    from aiayn.implementations import registry
    from aiayn.implementations.zoo import ZOO

    rows = [(name, registry.BUILTINS[name], "built-in") for name in registry.BUILTINS]
    rows += [(name, target, f"zoo ({ZOO[name].library})") for name, target in registry.zoo().items()]
    entry_points = registry.entry_points()
    rows += [
        (name, ep.value, f"entry point ({ep.dist.name if ep.dist else '?'})")
        for name, ep in sorted(entry_points.items())
        if name not in registry.BUILTINS and name not in ZOO
    ]
    width = max(len(name) for name, _, _ in rows)
    for name, target, origin in rows:
        line = f"{name:<{width}}  {origin}: {target}"
        if not args.no_load:
            try:
                impl = registry.load(name)
            except registry.ImplementationNotFound as exc:
                extra = missing_extra(exc)
                line += f"\n{'':<{width}}  not available: {extra or ' '.join(str(exc).split())[:200]}"
            else:
                line += (
                    f"\n{'':<{width}}  {impl.version} on {impl.device}; dtypes {', '.join(impl.dtypes)}; "
                    f"{len(_provided(impl))} of 12 equations"
                )
        print(line)
    print(
        f"\nOr name any implementation as module:attr (aiayn check mypkg.attention:Mine); packages register names "
        f"under the entry-point group {registry.ENTRY_POINT_GROUP!r}."
    )
    return EXIT_OK


def _provided(impl: object) -> frozenset[str]:
    from aiayn.implementations.protocol import provided_equations

    return provided_equations(impl)


def _add_replay(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="failure files (.npz) that a failed check saved (its message names the file)",
    )
    p.add_argument(
        "--impl",
        default=None,
        metavar="SPEC",
        help="check this implementation instead of the one recorded in the file; needed when the file names a "
        "module:attr (aiayn imports only built-in, zoo and entry-point names on a file's word)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="load the implementation into this process, to step into it with a debugger (default: a process of its "
        "own, where a crash or os._exit fails the check instead of ending the replay)",
    )


def _replay(args: argparse.Namespace) -> int:
    from aiayn.conformance.replay import ReplayError, replay

    try:
        return replay(args.files, args.impl, in_process=args.in_process)
    except ReplayError as exc:
        raise UsageError(str(exc)) from None


# --------------------------------------------------------------------------------------------
# aiayn reproduce, train, train-report, ablation


def _add_reproduce(p: argparse.ArgumentParser) -> None:
    from aiayn.reproductions.runner import add_arguments

    add_arguments(p)


def _reproduce(args: argparse.Namespace) -> int:
    from aiayn.reproductions.runner import run

    return run(args)


def _translation(name: str) -> Callable[..., object]:
    module = importlib.import_module("aiayn.reproductions.translation.cli")
    return getattr(module, name)


# --------------------------------------------------------------------------------------------
# aiayn bench, aiayn mutants


def _add_bench(p: argparse.ArgumentParser) -> None:
    from aiayn.benchmarks import verdict
    from aiayn.environment import OUT_HELP

    p.add_argument(
        "specs",
        nargs="*",
        metavar="SPEC",
        help="implementations to time: registry names or module:attr (default: the built-ins, with the NumPy "
        "stage breakdown and the training-step cases)",
    )
    p.add_argument("--sizes", default=None, metavar="N,N", help="sequence lengths n (default: 128,512,2048)")
    p.add_argument(
        "--big-sizes",
        default=None,
        metavar="N,N",
        help="more lengths for the built-ins whose attention memory is O(n) (numpy-blocked, torch-sdpa), every pass "
        "chosen (default: 8192, none with --sizes; '' for none)",
    )
    p.add_argument("--dtypes", default=None, metavar="DTYPE,DTYPE", help="dtypes (default: float32,float64)")
    p.add_argument(
        "--causal",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only the causal cases (--no-causal: only the unmasked ones; default: both)",
    )
    p.add_argument(
        "--passes",
        default=None,
        metavar="PASS,PASS",
        help="forward, backward, forward+backward (default: all three)",
    )
    p.add_argument("--smoke", action="store_true", help="the seconds-long CI subset (n = 128, one round)")
    p.add_argument(
        "--cuda",
        action="store_true",
        help="the CUDA cases: torch and torch-sdpa, float32 and bfloat16, n up to 8192, "
        "against a cuBLAS GEMM ceiling; writes benchmarks-cuda.*",
    )
    p.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    p.add_argument(
        "--force",
        action="store_true",
        help="replace what holds more cases than this run: a report of larger scope at the destination, and a "
        "--save FILE that stores a run of more cases (default: the report is written beside the larger one, under "
        "a name that says its scope; the larger --save FILE is kept, exit 4)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="stored runs (--save) to compare with: one (the rank test on its rounds, asv's rule) or at least 3 "
        "(the run as the unit: a prediction bound from their medians, steadier on a shared machine); exit 1 if "
        "a case regressed, 4 if a FILE is from another machine kind, device, thread count or library build, or "
        "shares no case with this run (default: no comparison)",
    )
    p.add_argument(
        "--reference",
        type=Path,
        default=None,
        metavar="FILE",
        help="a stored run (--save) shown beside this run, case by case, with no verdict (a run recorded on another "
        "host: ratios move by tens of percent between VMs of one kind); exit 0 whatever it shows "
        "(default: none)",
    )
    p.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="FILE",
        help="store this run as a baseline in FILE, in a folder that exists; a FILE that holds a run of more cases "
        "(or no run of aiayn bench) is kept unless --force (default: not stored)",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=verdict.DEFAULT_FACTOR,
        help="a case regressed only if its median ratio fell by more than this factor (asv's default)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=verdict.DEFAULT_ALPHA,
        help="... and a one-sided Mann-Whitney U test on the rounds gives p below this (asv's threshold)",
    )
    p.add_argument(
        "--history",
        type=Path,
        default=None,
        metavar="FILE",
        help="append this run to FILE (JSON Lines) and write <stem>-history.{md,json,png} of every run in it",
    )
    p.add_argument(
        "--from-run",
        type=Path,
        default=None,
        metavar="RUN.json",
        help="do not measure: write the report (and the comparison) from this earlier run's pytest-benchmark JSON",
    )
    duet = p.add_argument_group("a duet: a regression decided on paired rounds of old and new in this one run")
    duet.add_argument(
        "--against",
        default=None,
        metavar="SPEC",
        help="time each SPEC against this implementation round by round, alternating which goes first; exit 1 if a "
        "case of a SPEC is slower beyond --margin with confidence (default: no duet)",
    )
    duet.add_argument(
        "--against-rev",
        default=None,
        metavar="REV",
        help="time each SPEC against the same SPEC at git revision REV of the repository here, installed beside this "
        "one (pip, no dependencies) (default: no duet)",
    )
    duet.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="paired rounds per case of a duet (default: 40, 20 blocks of two: the 3rd smallest block bounds the "
        "median at 8 cases)",
    )
    duet.add_argument(
        "--margin",
        type=float,
        default=verdict.DEFAULT_MARGIN,
        help="a duet's case regressed only if new/old time exceeds 1 + this with confidence",
    )
    p.epilog = (
        "Exit status: 0 no regression (or no baseline); 1 a case regressed against --baseline or in a duet; 4 a "
        "usage error, "
        "including a baseline that cannot be compared or compared nothing, a --save FILE kept, and a case too "
        "large for this machine's memory. More pytest options go after --, e.g. "
        "aiayn bench numpy -- --bench-max-rounds 20"
    )


def _bench_stem(args: argparse.Namespace, run: dict | None = None) -> str:
    """``benchmarks`` for the built-ins' run, ``benchmarks-cuda`` for ``--cuda``, ``bench-<specs>`` for chosen specs.

    A report written ``--from-run`` (``run``, without SPEC) takes the stem the run was measured under:
    ``<stem>-run.json`` is the name ``aiayn bench`` gives its runs; a run stored under another name is
    the built-ins' when it timed more than ``test_attention`` (stages, training: only the built-ins' run
    does), else ``bench-<its implementations>``, so that a stored run of one's own code never overwrites
    the built-ins' report.
    """
    from aiayn.benchmarks.report import spec_stem

    if args.cuda:
        return "benchmarks-cuda"
    specs = list(args.specs)
    if run is not None and not specs:
        name = Path(args.from_run).name
        if name.endswith("-run.json") and len(name) > len("-run.json"):
            return name[: -len("-run.json")]
        impls = (run.get("aiayn") or {}).get("implementations") or {}
        tests = {str(b.get("name", "")).split("[")[0] for b in run.get("benchmarks", [])}
        if tests != {"test_attention"} or not impls:
            return "benchmarks"
        specs = sorted(impls)
    if not specs:
        return "benchmarks"
    return spec_stem(specs)


def _choices(option: str, text: str, known: Sequence[str]) -> str:
    """A comma-separated list of names from ``known``, normalised; else a one-line usage error naming ``option``."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(x not in known for x in names):
        raise UsageError(f"{option}: expected one or more of {', '.join(known)}, got {text!r}")
    return ",".join(names)


def _bench_specs(specs: Sequence[str]) -> None:
    """Every SPEC given once, loadable, and computing Eq. (1), the one equation aiayn bench times; else a one-line
    usage error naming it, before any work."""
    from aiayn.implementations import registry

    twice = sorted({spec for spec in specs if specs.count(spec) > 1})
    if twice:
        raise UsageError(f"SPEC: {', '.join(map(repr, twice))} given twice (its cases would overwrite each other)")
    _loadable(specs)
    for spec in specs:
        provided = _provided(registry.load(spec))
        if "scaled_dot_product_attention" not in provided:
            raise UsageError(
                f"SPEC: {spec!r} does not provide Eq. (1) (no scaled_dot_product_attention among its equations: "
                f"{', '.join(sorted(provided)) or 'none'}); aiayn bench times Eq. (1) only"
            )


def _bench_selection(args: argparse.Namespace) -> tuple[list[str], list | None]:
    """The pytest options of the chosen cases, each option checked here (a bad value is a one-line usage error), and
    the attention cases they make, as the benchmarks' conftest builds them (None when options after -- choose
    cases too: then only pytest knows them)."""
    from aiayn.benchmarks import cases as C
    from aiayn.implementations.protocol import DTYPES

    cmd = []
    impls, big_impls, dtypes = C.BUILTIN_IMPLS, C.MEMORY_BOUNDED_IMPLS, C.DTYPES
    sizes, big_sizes = (C.SMOKE.sizes, C.SMOKE.big_sizes) if args.smoke else (C.FULL_SIZES, C.BIG_SIZES)
    if args.cuda:  # the options _bench gives pytest for --cuda
        impls = big_impls = ("torch", "torch-sdpa")
        dtypes, big_sizes = ("float32", "bfloat16"), (8192,)
    masks, passes = C.MASKS, tuple(C.PASSES)
    if args.specs:
        _bench_specs(args.specs)
        specs = ",".join(args.specs)
        cmd += [f"--bench-impls={specs}", "--bench-big-impls=", "--bench-stages=", "--bench-training="]
        impls, big_impls = tuple(args.specs), ()
    if args.sizes is not None:
        sizes = _lengths("--sizes", args.sizes)
        cmd.append(f"--bench-sizes={','.join(map(str, sizes))}")
        big_sizes = ()
    if args.big_sizes is not None:
        big_sizes = _lengths("--big-sizes", args.big_sizes) if args.big_sizes.strip() else ()
    if args.sizes is not None or args.big_sizes is not None:
        cmd.append(f"--bench-big-sizes={','.join(map(str, big_sizes))}")
    if args.dtypes is not None:
        names = _choices("--dtypes", args.dtypes, DTYPES)
        cmd.append(f"--bench-dtypes={names}")
        dtypes = tuple(names.split(","))
    if args.causal is not None:
        masks = ("causal",) if args.causal else ("full",)
        cmd.append(f"--bench-masks={masks[0]}")
    if args.passes is not None:
        names = _choices("--passes", args.passes, passes)
        cmd.append(f"--bench-passes={names}")
        passes = tuple(names.split(","))
    if any(arg.startswith("--bench-") for arg in args.pytest_args):
        return cmd, None
    return cmd, C.build_cases(impls, dtypes, sizes, big_sizes, big_impls, masks=masks, passes=passes)


def _lengths(flag: str, text: str) -> tuple[int, ...]:
    """Comma-separated sequence lengths, or a usage error naming ``flag``."""
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated positive integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"{flag}: expected comma-separated positive integers, got {text!r}")
    if max(sizes) > 2**31:
        raise UsageError(f"{flag}: expected sequence lengths of at most 2^31 = {2**31}, got {max(sizes)}")
    return sizes


def _bytes(count: float) -> str:
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,.0f} bytes"


def _bench_fits(args: argparse.Namespace, plan: list) -> None:
    """The largest planned case fits in the memory this machine has available (a lower bound of what it holds:
    :func:`aiayn.benchmarks.cases.least_bytes`); else a one-line usage error stating both, before any work. CUDA
    cases hold device memory, not checked here."""
    from aiayn.benchmarks.cases import least_bytes
    from aiayn.benchmarks.measure import available_memory

    available = available_memory()
    if args.cuda or not plan or available is None:
        return
    largest = max(plan, key=lambda case: least_bytes(case)[0])
    need, words = least_bytes(largest)
    if need > available[0]:
        option = "--sizes" if args.sizes is not None else "the chosen cases"
        raise UsageError(
            f"{option}: the largest case, {largest.id} (n = {largest.n}), holds at least {_bytes(need)} ({words}), "
            f"more than the {_bytes(available[0])} available here ({available[1]})"
        )


def _bench_overlap(args: argparse.Namespace, plan: list, baselines: list[dict]) -> None:
    """Each baseline shares a planned case with this run; else a one-line usage error (it would compare nothing)
    naming the baseline and what it holds against what would run, before any work."""
    from aiayn.benchmarks import compare

    planned = [{"impl": c.impl, "dtype": c.dtype, "n": c.n} for c in plan]
    ids = {c.id for c in plan}
    for path, baseline in zip(args.baseline or [], baselines, strict=True):
        if not ids & compare.case_figures(baseline, "ratio_full").keys():
            raise UsageError(
                f"--baseline: {path}: compared nothing: it holds {compare.holdings(baseline)}, this run would time "
                f"{compare.describe_cases(planned)}; no case in common"
            )


def _shown(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 100 else f"{text[:60]}...{text[-20:]} ({len(text)} characters)"


def _bench_paths(args: argparse.Namespace) -> None:
    """Every path option names a path this system can name (no component longer
    than its NAME_MAX, no path longer than its PATH_MAX, no other error than 'no such file'); else a one-line usage
    error naming it, before any work."""
    try:
        name_max, path_max = os.pathconf("/", "PC_NAME_MAX"), os.pathconf("/", "PC_PATH_MAX")
    except (AttributeError, OSError, ValueError):
        name_max, path_max = 255, 4096
    named = [("--out", args.out), ("--save", args.save), ("--history", args.history), ("--from-run", args.from_run)]
    named += [("--baseline", path) for path in args.baseline or []]
    for option, path in named:
        if path is None:
            continue
        raw = os.fsencode(path)
        if len(raw) >= path_max or any(len(part) > name_max for part in raw.split(b"/")):
            raise UsageError(
                f"{option}: {_shown(path)}: name too long (at most {name_max} bytes a name, {path_max - 1} a path)"
            )
        try:
            os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise UsageError(f"{option}: {_shown(path)}: {exc.strerror or exc}") from None


def _bench_save_target(path: Path) -> None:
    """``--save FILE``: not a folder, in a folder that exists (it is not created: a mistyped folder is said, not
    made) and takes files; else a one-line usage error."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--save: {path} is a folder, expected a file name")
    folder = path.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise UsageError(f"--save: {path}: its folder {folder} {what}")
    writable_dir(folder, "--save")


def _bench(args: argparse.Namespace) -> int:
    from aiayn import benchmarks
    from aiayn.benchmarks import compare, history, runfile
    from aiayn.benchmarks.report import keyed_stem, write
    from aiayn.kit import Scope

    _bench_paths(args)
    out = out_dir(args.out)
    if args.against is not None or args.against_rev is not None:
        return _bench_duet(args, out)
    if args.rounds is not None:
        raise UsageError("--rounds: the rounds of a duet; give --against or --against-rev with it")
    check_range("--factor", args.factor, least=1.0)
    if not 0.0 < args.alpha < 1.0:
        raise UsageError(f"--alpha: expected a p-value threshold strictly between 0 and 1, got {args.alpha}")
    if args.cuda and (args.specs or args.baseline):
        raise UsageError("--cuda: runs the built-in CUDA cases; give no SPEC and no --baseline with it")
    baselines = []
    if args.baseline is not None:
        compare.check_baseline_count(len(args.baseline))  # before the measurement, not after it
        baselines = [compare.load_baseline(path) for path in args.baseline]
    if args.reference is not None and (args.baseline is not None or args.cuda):
        raise UsageError("--reference: a run shown beside this one without a verdict; give no --baseline or --cuda")
    reference = None if args.reference is None else compare.load_baseline(args.reference, "--reference")
    if args.save is not None:
        _bench_save_target(args.save)
    if args.history is not None:
        writable_dir(Path(args.history).resolve().parent, "--history")
        if Path(args.history).exists():
            history.load(args.history)  # a history that cannot be read is refused before the work, not after it
    refusal = None
    if args.from_run is not None:
        run_json = Path(args.from_run)
        run = compare.load_run(run_json, "--from-run")
        stem = _bench_stem(args, run)
        if stem.startswith("bench-"):
            stem = keyed_stem(out, stem, [*args.specs, *(c["impl"] for c in runfile.timed_cases(run))])
        if args.save is not None:
            refusal = runfile.save_refusal(args.save, runfile.run_scope(run, args.smoke), args.force)
            if refusal is not None:
                raise UsageError(f"--save: {refusal}")
    else:
        selection, plan = _bench_selection(args)
        if plan is not None:
            _bench_fits(args, plan)
            _bench_overlap(args, plan, baselines)
        if args.save is not None:
            planned = None if plan is None else Scope("planned cases", float(len(plan)), full=not args.smoke)
            refusal = runfile.save_refusal(args.save, planned, args.force)
            if refusal is not None:
                raise UsageError(f"--save: {refusal}")
        if args.cuda:
            torch = importlib.import_module("aiayn.environment").require("torch")
            if not torch.cuda.is_available():
                raise UsageError("--cuda: torch sees no CUDA device here")
        stem = _bench_stem(args)
        if args.specs:
            stem = keyed_stem(out, stem, args.specs)
        run_json = Path(out) / "tmp" / f"{stem}-run.json"
        run_json.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(benchmarks.__file__).resolve().parent
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            str(folder / "test_bench_attention.py") + "::test_attention" if args.specs else str(folder),
            "-p",
            "no:cacheprovider",
            f"--rootdir={folder}",
            f"--benchmark-json={run_json}",
            f"--benchmark-storage=file://{run_json.parent.resolve() / 'benchmark-storage'}",  # not ./.benchmarks
        ]
        if not args.specs:
            cmd.append("--bench-training-step=aiayn.reproductions.translation.bench:training_step")  # our model
        if args.smoke:
            cmd.append("--bench-smoke")
        if args.cuda:
            cmd += [
                "--bench-impls",
                "torch,torch-sdpa",
                "--bench-dtypes",
                "float32,bfloat16",
                "--bench-big-impls",
                "torch,torch-sdpa",
                "--bench-big-sizes",
                "8192",
                "--bench-gemm-n",
                "8192",
                "--bench-stages=",
            ]
        cmd += selection + args.pytest_args
        # one thread (two threads on small shared VMs swing by 2-4x); OPENBLAS_CORETYPE/L2_SIZE, set on
        # some machines for old OpenBLAS builds, slow a current numpy; the measuring session is its own, never a
        # worker of a pytest-xdist run that called aiayn bench (pytest-benchmark writes no JSON in a worker)
        inherited = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTEST_CURRENT_TEST")
        env = {k: v for k, v in os.environ.items() if k not in inherited and not k.startswith("PYTEST_XDIST")}
        env |= importlib.import_module("aiayn.benchmarks.measure").ONE_THREAD_ENV
        status = subprocess.run(cmd, env=env, check=False).returncode
        if status != 0:
            return status
        print(f"wrote {run_json.resolve()}")
        run = compare.load_run(run_json, "the run")
        if args.save is not None:  # the run is measured now: its own scope against the stored one
            refusal = runfile.save_refusal(args.save, runfile.run_scope(run, args.smoke), args.force)
    comparison, note = None, None
    same = [str(path) for path, b in zip(args.baseline or [], baselines) if b.get("datetime") == run.get("datetime")]
    if same:
        note = f"Baseline {', '.join(same)} is this very run: nothing to compare."
    elif baselines:
        comparison = compare.compare_runs(baselines, run, factor=args.factor, alpha=args.alpha)
        note = (
            "Baseline: "
            + "; ".join(f"{path}, run of {b.get('datetime', 'n/a')}" for path, b in zip(args.baseline, baselines))
            + "."
        )
    beside = None
    if reference is not None:
        beside = [f"Stored run {args.reference}, run of {reference.get('datetime', 'n/a')}:", ""]
        beside += ["```", *compare.format_reference(reference, run), "```"]
    write(
        run_json,
        out,
        comparison=comparison,
        baseline_note=note,
        reference=beside,
        stem=stem,
        smoke=args.smoke,
        force=args.force,
    )
    if args.save is not None and refusal is None:
        runfile.store(run_json, args.save)
        print(f"saved this run as a baseline: {Path(args.save).resolve()}")
    if args.history is not None:
        history.append(args.history, run)
        history.write(args.history, out, stem=f"{stem}-history", force=args.force)
    if reference is not None:
        print(f"beside the stored run {args.reference} (reference only, no verdict):")
        for line in compare.format_reference(reference, run):
            print(line)
    problems = [] if refusal is None else [f"--save: {refusal}; this run stays in {run_json}"]
    if comparison is not None:
        for line in compare.format_comparison(comparison):
            print(line)
        if comparison.incompatible is not None:
            files = " ".join(str(path) for path in args.baseline)
            problems.append(f"--baseline: {files}: {comparison.incompatible}")
    if problems:
        print(f"aiayn bench: {'; '.join(problems)}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if comparison is None else comparison.exit_status


def _bench_duet(args: argparse.Namespace, out: Path) -> int:
    """``aiayn bench [SPEC ...] --against SPEC | --against-rev REV``: a duet per SPEC (default: the built-ins), its
    report ``duet-<stem>.{md,json}``, exit 1 if a case regressed."""
    from aiayn.benchmarks import duet, verdict
    from aiayn.benchmarks import report as R
    from aiayn.benchmarks.cases import BUILTIN_IMPLS
    from aiayn.environment import cache_dir
    from aiayn.kit import write_report

    if args.against is not None and args.against_rev is not None:
        raise UsageError("--against, --against-rev: one old side; give one of them")
    others = (
        [
            name
            for name, given in (
                ("--baseline", args.baseline),
                ("--reference", args.reference),
                ("--save", args.save),
                ("--history", args.history),
                ("--from-run", args.from_run),
            )
            if given is not None
        ]
        + (["--cuda"] if args.cuda else [])
        + (["--smoke"] if args.smoke else [])
    )
    if others:
        raise UsageError(f"{others[0]}: a duet decides on its own rounds; give no {', '.join(others)} with it")
    rounds = duet.DEFAULT_ROUNDS if args.rounds is None else args.rounds
    if rounds < 4:
        raise UsageError(f"--rounds: expected at least 4 paired rounds (2 blocks), got {rounds}")
    check_range("--margin", args.margin, least=0.0)
    specs = list(args.specs) or list(BUILTIN_IMPLS)
    args.specs = specs
    selection, plan = _bench_selection(args)
    if plan is None:
        raise UsageError("a duet chooses its cases by --sizes, --dtypes, --passes and --causal, not by pytest options")
    cases = {(c.dtype, c.n, c.causal, c.pass_): c for c in plan}  # one of each per spec
    path = None
    if args.against_rev is not None:
        where = cache_dir() / "duet"
        print(f"installing revision {args.against_rev} beside this one ({where}) ...", flush=True)
        try:
            path = str(duet.install_revision(args.against_rev, Path.cwd(), where))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    runs = []
    for spec in specs:
        old = (
            duet.Side(args.against, "old", None)
            if args.against is not None
            else duet.Side(spec, f"old ({args.against_rev})", path)
        )
        print(f"duet: {spec} (new) against {old.spec} ({old.label}), {len(cases)} cases x {rounds} rounds", flush=True)
        runs.append(duet.run(duet.Side(spec, "new"), old, list(cases.values()), rounds, progress=sys.stdout))
    report, verdicts = R.duet_report(runs, args.margin)
    write_report(out, report, "duet-" + R.spec_stem(specs).removeprefix("bench-"), force=True)
    print(report.verdict)
    return verdict.EXIT_REGRESSION if any(v.regressed for v in verdicts) else verdict.EXIT_OK


def _add_false_alarms(p: argparse.ArgumentParser) -> None:
    from aiayn.conformance.inputs.profiles import PROFILES
    from aiayn.conformance.run.runner import default_workers
    from aiayn.implementations.registry import BUILTINS

    p.add_argument(
        "specs",
        nargs="*",
        metavar="SPEC",
        default=list(BUILTINS),
        help="implementations believed correct (default: every built-in)",
    )
    p.add_argument("--profile", choices=list(PROFILES), default="dev", help="Hypothesis profile of every run")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated Hypothesis seeds, one run each")
    p.add_argument("--workers", type=int, default=default_workers(), help="worker processes of each run")
    add_output_arguments(p)
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="where each finished (seed, implementation) unit is stored and found again by a later call "
        "(default: aiayn's cache folder, false-alarms/<profile>)",
    )


def _false_alarms(args: argparse.Namespace) -> int:
    from aiayn.conformance.studies.false_alarms import StoredUnitError, run

    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    if not seeds:
        raise UsageError("--seeds: give at least one seed")
    check_range("--workers", args.workers, least=0)
    out = out_dir(args.out)
    if args.work is not None:
        writable_dir(args.work, "--work")
    check_work_dirs()
    _loadable(args.specs)  # a spec that cannot be loaded is a usage error, never a stored alarm
    try:
        alarmed = run(
            args.specs,
            profile=args.profile,
            seeds=seeds,
            workers=args.workers,
            out=out,
            work=args.work,
            force=args.force,
        )
    except StoredUnitError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_FAILED if alarmed else EXIT_OK


def _loadable(specs: Sequence[str]) -> None:
    """Load every spec once before the work; one that cannot be loaded is a one-line usage error."""
    from aiayn.implementations import registry

    for spec in specs:
        try:
            registry.load(spec)
        except MissingExtra:
            raise
        except Exception as exc:  # the registry's own errors say what failed; any other is the spec's own code
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UsageError(f"SPEC: {spec!r} cannot be loaded: {first}") from None


def _add_zoo(p: argparse.ArgumentParser) -> None:
    from aiayn.conformance.inputs.profiles import PROFILES
    from aiayn.conformance.run.isolation import DEFAULT_LIMIT_S
    from aiayn.conformance.run.runner import default_workers
    from aiayn.implementations.zoo import ZOO

    p.add_argument(
        "names", nargs="*", metavar="NAME", default=list(ZOO), help="zoo adapters to check (default: all of them)"
    )
    p.add_argument("--profile", choices=list(PROFILES), default="ci", help="Hypothesis profile of the run")
    p.add_argument("--workers", type=int, default=default_workers(), help="worker processes of the suite")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_LIMIT_S,
        help="time limit of one call into an implementation, seconds (0: none)",
    )
    add_output_arguments(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="float32 only, each equation's agreement test with the oracle and the contract only (what CI runs)",
    )
    p.add_argument(
        "--no-run",
        action="store_true",
        help="check nothing: write zoo.md again from the adapters' stored reports (OUT/zoo/*.json) and the stored "
        "session (OUT/zoo.json), e.g. after a change to how cells are summarised",
    )


def _zoo(args: argparse.Namespace) -> int:
    from aiayn.conformance.studies.zoo import run
    from aiayn.implementations.zoo import ZOO

    unknown = [n for n in args.names if n not in ZOO]
    if unknown:
        raise UsageError(f"NAME: {', '.join(map(repr, unknown))} not in the zoo; expected some of {', '.join(ZOO)}")
    check_range("--workers", args.workers, least=0)
    check_range("--timeout", args.timeout, least=0)
    if args.no_run:
        from aiayn.conformance.studies.zoo import rerender

        try:
            return rerender(args.names, out=out_dir(args.out))
        except FileNotFoundError as e:
            raise UsageError(f"--no-run: {e}") from None
    return run(
        args.names,
        profile=args.profile,
        workers=args.workers,
        out=out_dir(args.out),
        timeout=args.timeout,
        quick=args.quick,
        force=args.force,
    )


def _add_bench_noise(p: argparse.ArgumentParser) -> None:
    from aiayn.benchmarks.noise import add_arguments

    add_output_arguments(p)
    add_arguments(p)


def _bench_noise(args: argparse.Namespace) -> int:
    from aiayn.benchmarks.noise import run

    if args.work is not None:
        writable_dir(args.work, "--work")
    return run(args)


def _add_mutants(p: argparse.ArgumentParser) -> None:
    add_output_arguments(p)
    p.add_argument("--workers", type=int, default=2, help="worker processes of the suite")


def _mutants(args: argparse.Namespace) -> int:
    from aiayn.conformance.studies.mutants import run

    check_range("--workers", args.workers, least=0)
    return run(out_dir(args.out), workers=args.workers)


# --------------------------------------------------------------------------------------------
# the command table and main


#: name -> (one-line help, add_arguments, run). ``add_arguments`` is called only for the chosen command.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "check": ("check an implementation against the paper, equation by equation", _add_check, _check),
    "list": ("the implementations aiayn knows, with versions", _add_list, _list),
    "replay": ("rerun a failed check from its saved inputs", _add_replay, _replay),
    "reproduce": ("regenerate the paper's tables and worked numbers", _add_reproduce, _reproduce),
    "train": (
        "train, decode and score the paper's model (starts only with --preset)",
        lambda p: _translation("add_train_arguments")(p),
        lambda a: _translation("run_train")(a),
    ),
    "train-report": (
        "one bleu-training report from finished training runs",
        lambda p: _translation("add_report_arguments")(p),
        lambda a: _translation("run_report")(a),
    ),
    "ablation": (
        "Table 3's variations at CPU scale, several seeds per row",
        lambda p: _translation("add_ablation_arguments")(p),
        lambda a: _translation("run_ablation")(a),
    ),
    "bench": ("attention throughput as a fraction of this machine's GEMM ceiling", _add_bench, _bench),
    "bench-noise": (
        "how often the regression gate of aiayn bench is wrong here (unchanged and slowed copies)",
        _add_bench_noise,
        _bench_noise,
    ),
    "mutants": ("run the suite against deliberately broken implementations", _add_mutants, _mutants),
    "false-alarms": (
        "run the suite on correct implementations over many seeds, count alarms",
        _add_false_alarms,
        _false_alarms,
    ),
    "zoo": ("check popular libraries through thin adapters; write the zoo report", _add_zoo, _zoo),
}


def _descriptions(name: str) -> str:
    docs = {
        "check": "Run the conformance suite on SPEC: every equation it provides, in every dtype it declares, "
        "against the oracle.\n"
        "Ends with the per-equation table. Inputs of failed checks are saved under $AIAYN_FAILURES (else\n"
        "~/.cache/aiayn/failures) and replayed with `aiayn replay FILE`.",
        "reproduce": "Regenerate the reports of the paper's tables and worked numbers; every file written is printed.",
        "train": "Train Figure 1's model with the equations the suite checks, decode as §6.1 says, "
        "score with sacreBLEU.\n"
        "Under torchrun (`torchrun --nproc_per_node=2 -m aiayn train ...`) it trains data-parallel.",
        "zoo": "Check every zoo adapter whose library is installed (pip install 'aiayn[zoo]') "
        "and write reports/zoo.{md,json,png}:\n"
        "one row per implementation, one column per equation. Exit 0 when every failure is a named departure;\n"
        "1 when a failure is unnamed or an adapter does not load; 4 for a usage error.",
        "bench": "Time Eq. (1) (one thread), forward and backward, as fractions of this machine's GEMM ceiling; write\n"
        "benchmarks.{md,json,png} (the built-ins) or bench-<SPEC>.{md,json,png}. With --baseline, a regression\n"
        "verdict per case (median beyond --factor and a Mann-Whitney U test on the rounds below --alpha; against\n"
        "3 or more baseline runs, the median below the normal prediction bound of their medians).",
    }
    return docs.get(name, COMMANDS[name][0][:1].upper() + COMMANDS[name][0][1:] + ".")


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser, with the options of ``command`` (only) filled in."""
    top = _Parser(prog="aiayn", description=__doc__, formatter_class=_Formatter)
    top.add_argument("--version", action="version", version=f"aiayn {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (summary, add, _) in COMMANDS.items():
        parser = sub.add_parser(name, help=summary, description=_descriptions(name), formatter_class=_Formatter)
        if name == command:
            add(parser)
    return top


def _working_directory(command: str) -> None:
    """The working directory exists (every command resolves relative paths and default folders against it); else a
    one-line usage error before any work."""
    try:
        os.getcwd()
    except OSError as exc:
        raise UsageError(
            f"the working directory: {exc.strerror or exc} (was it deleted?); run aiayn {command} from a folder that "
            "exists"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``aiayn ARGV``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # what follows a bare -- goes to pytest (check, bench)
        argv, passthrough = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(command if command in COMMANDS else None)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version (0) or a usage error (4, _Parser.error)
            return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
        if passthrough and command not in ("check", "bench"):
            raise UsageError(f"options after -- are passed to pytest by check and bench only, not {command}")
        args.pytest_args = passthrough
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        _working_directory(args.command)
        return int(COMMANDS[args.command][2](args) or 0)
    except UsageError as exc:
        print(f"aiayn {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (MissingExtra, ModuleNotFoundError) as exc:
        extra = missing_extra(exc)
        if extra is None:
            raise
        print(f"aiayn {command}: {extra}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"aiayn {command}: interrupted", file=sys.stderr)
        return 2
