"""A duet: two implementations, or one implementation at two revisions, timed round by round in one run on one host.

``aiayn bench NEW --against OLD`` (or ``--against-rev REV``: the same SPEC, from git revision REV of the repository
the command runs in, installed beside this one) decides a regression on paired times, never on a baseline
recorded on another host or at another hour. Each side runs in a process of its own (this file run by path, one
thread, started with the side's environment: the old revision's folder first on ``sys.path``), so the two never
share a module or an allocator. Both are pinned to one CPU: the same core and caches for each, and never both
running (a side left on a core that other work shares would be slower for that alone). The parent sends both the
same case and asks each, in turn, for one timed call. The order alternates every
round (new first, old first, ...), so a drift of the machine's speed during a round pair falls on both sides alike
and the advantage of going first cancels within each block of two rounds. What a round gives is a ratio, new time
over old time, of two calls a few milliseconds apart.

The verdict on a case is :func:`aiayn.benchmarks.verdict.duet_case`: a regression when the distribution-free lower
confidence bound of the median block ratio lies beyond ``1 + margin`` (the level shared among the cases). The GEMM
ceiling of each side's library and dtype is measured by both sides before and after the cases, so each side's
fraction of it is reported too (the ratio of the two sides needs no ceiling: the flops are the same).

The protocol between the parent and a side is one JSON object per line: ``{"op": "case", ...}`` (make the inputs and
the call, warm it up; answer its gradient source), ``{"op": "time"}`` (answer one call's seconds), ``{"op":
"ceiling", ...}`` (answer GFLOP/s), ``{"op": "quit"}``. Every answer is read as untrusted: a number where a number is
due, else the duet stops with the side's words.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiayn.benchmarks.cases import Case

__all__ = ["DEFAULT_ROUNDS", "Side", "case_key", "install_revision", "run", "serve"]

#: Paired rounds per case: 20 blocks of two, whose distribution-free bound of the median at the level of one of 8
#: cases (0.01 / 8) is the 3rd smallest block (``verdict.sign_bound_rank``).
DEFAULT_ROUNDS = 40


@dataclass(frozen=True)
class Side:
    """One side of a duet: the spec its process loads, a label for reports, the folder put first on its
    ``sys.path`` (an old revision's install; None: this environment's), and environment variables of its own."""

    spec: str
    label: str
    path: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)


#: How a side's process starts: this file run by path (not imported as ``aiayn.benchmarks.duet``), so that an old
#: revision of aiayn first on its path serves its built-ins with this protocol.
#: A side with a folder of its own (an old revision) leaves the working directory off its path: run at the root of
#: a checkout, the checkout's own package would come first.
_BOOT = (
    "import os, runpy, sys; here = os.getcwd()\n"
    "if sys.argv[3] == 'own-path': sys.path[:] = [p for p in sys.path if p not in ('', '.', here)]\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')"
)


class _Process:
    """A side's process: one request, one answer."""

    def __init__(self, side: Side, cpu: int | None) -> None:
        # the parent's own import: this file also runs in a side beside an old revision of aiayn, which must not
        # need names newer than its own (a side imports only what its serving needs)
        from aiayn.benchmarks.measure import ONE_THREAD_ENV

        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST") and k != "PYTEST_CURRENT_TEST"}
        env |= {**ONE_THREAD_ENV, **side.env}
        if side.path is not None:
            env["PYTHONPATH"] = os.pathsep.join([side.path, *filter(None, [env.get("PYTHONPATH")])])
        self.side = side
        # what the side prints to stderr (warnings, a traceback) goes to a file: a pipe nobody reads while the side
        # answers thousands of requests would fill and stall it
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(Path(__file__).resolve()), side.spec, "own-path" if side.path else "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        if cpu is not None:  # both sides on one CPU: the same core and caches for each, and never both running
            os.sched_setaffinity(self.proc.pid, {cpu})

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.proc.wait(timeout=10)
            self.stderr.seek(0)
            err = self.stderr.read()[-2000:]
            raise RuntimeError(f"duet side {self.side.label} ({self.side.spec}) ended: {err.strip() or 'no output'}")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(f"duet side {self.side.label}: expected one JSON object, got {line[:200]!r}") from None
        if not isinstance(answer, dict) or "error" in answer:
            raise RuntimeError(f"duet side {self.side.label} ({self.side.spec}): {answer!r}"[:2000])
        return answer

    def number(self, request: Mapping[str, Any], key: str) -> float:
        value = self.ask(request).get(key)
        if type(value) is not float or not (math.isfinite(value) and value > 0):
            raise RuntimeError(f"duet side {self.side.label}: {key} = {value!r}, expected a positive finite float")
        return value

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask({"op": "quit"})
            except RuntimeError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.stderr.close()


def _ceilings(sides: Sequence[_Process], library: str, dtype: str, gemm_n: int) -> list[float]:
    return [p.number({"op": "ceiling", "library": library, "dtype": dtype, "n": gemm_n}, "gflops") for p in sides]


def _shared_cpu() -> int | None:
    """The CPU both sides run on: the highest this process may use (the lowest takes more of the system's
    interrupts); None where the system sets no affinity."""
    getter = getattr(os, "sched_getaffinity", None)
    return max(getter(0)) if getter is not None else None


def case_key(case: Case) -> str:
    """``float32-n2048-causal-forward+backward``: a case of a duet, without an implementation's name."""
    mask = "causal" if case.causal else "full"
    return f"{case.dtype}-n{case.n}-{mask}" + ("" if case.pass_ == "forward" else f"-{case.pass_}")


def run(
    new: Side,
    old: Side,
    cases: Sequence[Case],
    rounds: int = DEFAULT_ROUNDS,
    gemm_n: int = 1024,
    progress: IO[str] | None = None,
) -> dict[str, Any]:
    """Every case of ``cases`` (their ``impl`` ignored: each side times its own spec) timed on both sides, ``rounds``
    paired rounds each, alternating which side goes first; the ceilings of each library and dtype before and after.
    Returns the run: settings, ceilings, and per case both sides' round times and the ratios new / old."""
    if rounds < 2:
        raise ValueError(f"rounds: expected at least 2 paired rounds, got {rounds}")
    cpu = _shared_cpu()
    sides = [_Process(new, cpu), _Process(old, cpu)]
    out: dict[str, Any] = {
        "new": {"spec": new.spec, "label": new.label, "path": new.path},
        "old": {"spec": old.spec, "label": old.label, "path": old.path},
        "rounds": rounds,
        "gemm_n": gemm_n,
        "cpu": cpu,
        "cases": [],
        "ceilings": [],
    }
    try:
        libraries = {}
        for i, case in enumerate(cases):
            request = {"op": "case", "dtype": case.dtype, "n": case.n, "causal": case.causal, "pass": case.pass_}
            answers = [p.ask(request) for p in sides]
            key = tuple(str(a.get("library")) for a in answers)
            for side, answer in zip(("new", "old"), answers, strict=True):
                out[side].setdefault("file", str(answer.get("file")))  # where each side's code was loaded from
            for library in key:
                if (library, case.dtype) not in libraries:
                    libraries[(library, case.dtype)] = _ceilings(sides, library, case.dtype, gemm_n)
            times: list[list[float]] = [[], []]
            for r in range(rounds):
                order = (0, 1) if r % 2 == 0 else (1, 0)
                for s in order:
                    times[s].append(sides[s].number({"op": "time"}, "seconds"))
            base = case_key(case)
            out["cases"].append(
                {
                    "case": base,
                    "dtype": case.dtype,
                    "n": case.n,
                    "causal": case.causal,
                    "pass_": case.pass_,
                    "flops_full": case.flops_full,
                    "libraries": list(key),
                    "gradient_sources": [a.get("source") for a in answers],
                    "new_times_s": times[0],
                    "old_times_s": times[1],
                    "ratios": [a / b for a, b in zip(times[0], times[1], strict=True)],
                }
            )
            if progress is not None:
                med = sorted(out["cases"][-1]["ratios"])[rounds // 2]
                print(
                    f"[{i + 1}/{len(cases)}] {base}: new/old time, median of {rounds} rounds {med:.3f}", file=progress
                )
        for (library, dtype), before in libraries.items():
            after = _ceilings(sides, library, dtype, gemm_n)
            out["ceilings"].append({"library": library, "dtype": dtype, "before_gflops": before, "after_gflops": after})
    finally:
        for p in sides:
            p.close()
    return out


def install_revision(rev: str, repo: Path, into: Path) -> Path:
    """The package of ``repo`` (a git work tree) at revision ``rev``, installed (no dependencies) into a folder of
    ``into``; returns the folder to put first on an old side's ``sys.path``. ValueError naming ``rev`` if git does
    not know it; RuntimeError with pip's words if it does not install."""
    git = shutil.which("git")
    if git is None:
        raise RuntimeError("--against-rev: git is not on PATH")
    probe = subprocess.run([git, "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True)
    if probe.returncode != 0:
        raise ValueError(f"--against-rev: {rev!r} is no commit of the git repository at {repo}")
    commit = probe.stdout.decode().strip()
    src, site = into / f"src-{commit[:12]}", into / f"site-{commit[:12]}"
    if (site / ".installed").exists():
        return site
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(site, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run([git, "-C", str(repo), "archive", commit], capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as fh:
        fh.write(archive)
        fh.seek(0)
        subprocess.run(["tar", "-x", "-C", str(src)], stdin=fh, check=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*pip, "--target", str(site), str(src)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"--against-rev {rev}: pip could not install it: {done.stderr.strip()[-1500:]}")
    (site / ".installed").write_text(commit + "\n", encoding="utf-8")
    return site


# --------------------------------------------------------------------------------------------
# a side's process


def _timer(impl: Any, case: Case) -> tuple[Any, dict[str, Any]]:
    """A function that times one call of ``case``'s pass (a backward: after its untimed setup), warmed up; and
    what the parent is told of it (the arrays' library, where the gradients come from)."""
    from aiayn.benchmarks import measure as M
    from aiayn.benchmarks.backward import passes_of
    from aiayn.benchmarks.cases import make_cotangent, make_inputs

    q, k, v, mask = make_inputs(impl, case)
    M.limit_threads(1)
    library, source = M.library_of(q), None

    def once(call: Any, state: Any = None) -> float:
        start = time.perf_counter()
        call() if state is None else call(state)
        return time.perf_counter() - start

    if case.pass_ == "forward":

        def timer() -> float:
            return once(lambda: M.sync(impl.scaled_dot_product_attention(q, k, v, mask)))

    else:
        passes = passes_of(impl, q, k, v, mask, make_cotangent(impl, case))
        source = passes.source

        def timer() -> float:
            if case.pass_ == "backward":
                return once(passes.backward, passes.setup())
            return once(passes.forward_backward)

    timer()  # the warm-up
    return timer, {"library": library, "source": source}


def serve(spec: str, stdin: IO[str], stdout: IO[str]) -> int:
    """Answer the parent's requests for the implementation ``spec`` (this process's own)."""
    from aiayn.benchmarks import measure as M
    from aiayn.implementations.registry import load

    impl = load(spec)
    M.limit_threads(1)
    timer = None
    for line in stdin:
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "quit":
                answer: dict[str, Any] = {"ok": True}
            elif op == "case":
                case = Case(spec, request["dtype"], int(request["n"]), bool(request["causal"]), request["pass"])
                timer, told = _timer(impl, case)
                module = sys.modules.get(type(impl).__module__)
                answer = {"ok": True, **told, "file": str(getattr(module, "__file__", None))}
            elif op == "time":
                if timer is None:
                    raise ValueError("time: no case made yet")
                answer = {"seconds": float(timer())}
            elif op == "ceiling":
                got = M.gemm_ceiling(request["library"], request["dtype"], int(request["n"]), 5)
                answer = {"gflops": float(got["gflops"])}
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as exc:  # the parent stops the duet with these words
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
        if op == "quit":
            break
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python duet.py SPEC (a side of aiayn bench --against)", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(serve(sys.argv[2] if len(sys.argv) > 3 else sys.argv[-1], sys.stdin, sys.stdout))
