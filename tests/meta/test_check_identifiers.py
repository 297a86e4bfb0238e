"""One identifier per check: the registered name, the function's name and the test's name (``test_<name>``)."""

from __future__ import annotations

import ast
from pathlib import Path

from aiayn.conformance.checks import load_all
from aiayn.conformance.run.harness import CHECKS

SUITE = Path(__file__).resolve().parents[2] / "conformance"


def _suite_tests() -> dict[str, str]:
    """test function name -> its module, for every test written out in the suite's test modules."""
    found = {}
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found[node.name] = path.name
    return found


def test_every_check_is_registered_under_its_functions_name() -> None:
    load_all()
    wrong = {name: fn.__name__ for name, fn in CHECKS.items() if fn.__name__ != name}
    assert not wrong, f"registered name -> function name: {wrong}"


def test_every_check_has_its_test_and_every_test_its_check() -> None:
    load_all()
    tests = {name.removeprefix("test_") for name in _suite_tests()}
    assert sorted(set(CHECKS) - tests) == [], "checks without a test_<name>"
    assert sorted(tests - set(CHECKS)) == [], "tests whose name is not a registered check"


def test_each_test_calls_the_check_of_its_name() -> None:
    """The body of test_<name> calls <module>.<name>(...), so a replay file, a report line and a declaration of
    ``name`` all mean that test."""
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                called = {
                    c.func.attr for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                }
                assert node.name.removeprefix("test_") in called, f"{path.name}::{node.name} calls {sorted(called)}"
