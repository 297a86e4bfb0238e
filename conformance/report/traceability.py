"""The README's traceability table, generated from the equations' records (``equations.py``) and the checks
registered for each (``checks/``); ``tests/meta/test_equation_records.py`` keeps the README in step."""

from __future__ import annotations

from aiayn.conformance.checks import load_all
from aiayn.conformance.diagnoses import forward as D
from aiayn.conformance.equations import RECORDS, Equation
from aiayn.conformance.run.harness import CHECKS
from aiayn.kit import md_table
from aiayn.reference import attention as ref_attention
from aiayn.reference import layers as ref_layers
from aiayn.reference import model as ref_model
from aiayn.reference import positional as ref_positional
from aiayn.reference import training as ref_training

__all__ = ["traceability"]


def traceability() -> str:
    """The README's table: equation -> section -> oracle -> budget -> backward -> checks -> diagnoses, from the
    records."""
    load_all()
    rows = []
    for r in RECORDS.values():
        checks = sorted(name for name, fn in CHECKS.items() if getattr(fn, "equation", None) == r.name)
        names = [d.name for d in D.CATALOGUE if d.family in r.departures]
        rows.append(
            [
                f"`{r.name}`",
                r.title,
                _oracle(r),
                f"{r.budget_name} ({r.oracle_share})",
                f"`{r.name}_vjp`; {r.backward.budget_name}"
                if r.backward
                else ("not yet" if r.differentiable else f"none ({r.no_backward})"),
                ", ".join(f"`{c}`" for c in checks),
                f"{len(names)} ({', '.join(sorted(r.departures))})",
            ]
        )
    headers = [
        "equation",
        "section",
        "oracle",
        "budget (oracle's share)",
        "backward: oracle VJP; budget",
        "checks",
        "departures named (families)",
    ]
    return "\n".join(md_table(headers, rows))


def _oracle(r: Equation) -> str:
    """`aiayn.reference.<module>.<function>` and, where the record names one, how it is called."""
    function, _, how = (r.oracle_name or r.name).partition(" ")
    for module in (ref_attention, ref_positional, ref_layers, ref_training, ref_model):
        if callable(getattr(module, function, None)):
            return f"`aiayn.reference.{module.__name__.rsplit('.', 1)[-1]}.{function}`" + (f" {how}" if how else "")
    raise LookupError(f"no oracle function {function!r} in aiayn.reference")
