"""The equation records (``conformance/equations.py``) are complete, the only table keyed by equation names, and the
README's traceability table is generated from them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from aiayn.conformance.checks import load_all
from aiayn.conformance.diagnoses import forward as D
from aiayn.conformance.equations import RECORDS, Equation
from aiayn.conformance.report.traceability import traceability
from aiayn.conformance.run.harness import CHECKS
from aiayn.implementations.protocol import EQUATIONS

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "conformance"
README = ROOT / "README.md"
BEGIN, END = "<!-- traceability: begin -->", "<!-- traceability: end -->"


def test_one_record_per_equation_in_paper_order() -> None:
    assert tuple(RECORDS) == EQUATIONS
    assert all(isinstance(r, Equation) and r.name == name for name, r in RECORDS.items())


@pytest.mark.parametrize("name", EQUATIONS)
def test_every_record_is_complete(name: str) -> None:
    r = RECORDS[name]
    assert "§" in r.title and r.short and r.budget_name, f"{name}: title, short name and budget name"
    assert r.arguments and len(set(r.arguments)) == len(r.arguments), f"{name}: the method's arguments, each once"
    for hook in (r.oracle, r.budget, r.model, r.strategy, r.policies):
        assert callable(hook), f"{name}: {hook!r} is not callable"
    assert r.oracle_share in ("added", "propagated")
    assert 0 <= r.max_unchecked < 1
    model_args = set(inspect.signature(r.model).parameters) - {"ops", "dtype"}
    assert set(r.arguments) <= model_args, f"{name}: the diagnoses model lacks {set(r.arguments) - model_args}"
    families = {d.family for d in D.CATALOGUE}
    assert r.departures and r.departures <= families, f"{name}: unknown families {r.departures - families}"
    load_all()
    assert getattr(CHECKS.get(name), "equation", None) == name, f"{name}: no agreement check registered under its name"


def test_every_catalogue_family_concerns_some_equation() -> None:
    used = set().union(*(r.departures for r in RECORDS.values()))
    unused = {d.name for d in D.CATALOGUE if d.family not in used}
    assert not unused, f"departures no equation can name: {sorted(unused)}"


def _tables_keyed_by_equations(tree: ast.AST) -> list[str]:
    """Where a module keeps knowledge per equation: a dict keyed by two or more equation names, a module-level
    collection of two or more (``__all__`` aside), or a membership test against such a literal."""
    names = set(EQUATIONS)

    def count(elts: list[ast.expr | None]) -> int:
        return sum(isinstance(e, ast.Constant) and e.value in names for e in elts)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and count(node.keys) >= 2:
            found.append(f"line {node.lineno}: a dict keyed by equation names")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            for right in node.comparators:
                if isinstance(right, (ast.Tuple, ast.List, ast.Set)) and count(right.elts) >= 2:
                    found.append(f"line {node.lineno}: a membership test against equation names")
    for node in getattr(tree, "body", []):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        value = getattr(node, "value", None)
        for sub in ast.walk(value) if value is not None else ():
            if isinstance(sub, (ast.Tuple, ast.List, ast.Set)) and count(sub.elts) >= 2:
                found.append(f"line {node.lineno}: a module-level collection of equation names")
                break
    return found


@pytest.mark.parametrize(
    "path",
    sorted(p for p in SUITE.rglob("*.py") if p.name != "equations.py"),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_other_module_keeps_a_table_keyed_by_equation_names(path: Path) -> None:
    found = _tables_keyed_by_equations(ast.parse(path.read_text(encoding="utf-8")))
    assert not found, f"{path.relative_to(ROOT)}: {'; '.join(found)} (put it into the records, equations.py)"


def test_the_ast_check_finds_what_it_looks_for() -> None:
    source = (
        'SHORT = {"softmax": "s", "layer_norm": "LN"}\n'
        'ONLY = ("lrate", "label_smoothing")\n'
        '__all__ = ["softmax", "layer_norm"]\n'
        'def f(e):\n    return e in ("softmax", "layer_norm")\n'
    )
    found = _tables_keyed_by_equations(ast.parse(source))
    assert [f.split(":")[0] for f in found] == ["line 1", "line 5", "line 2"], found


def test_readme_traceability_table_is_generated_from_the_records() -> None:
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"README.md lacks the {BEGIN} ... {END} block"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == traceability().strip(), (
        "README.md's traceability table differs from the records; paste the output of "
        "`python -c 'from aiayn.conformance.report.traceability import traceability; print(traceability())'`"
    )
