"""The import rules of README.md ("How the code is layered"), checked on every module's syntax tree.

- ``aiayn.reference`` (the oracle) imports nothing of ours;
- the ground floor (``aiayn``, ``aiayn.environment``, ``aiayn.kit``) imports only the ground floor;
- ``aiayn.implementations`` reads only the ground floor and reference's configurations
  (``aiayn.reference.counts``), never the oracle's equations;
- ``aiayn.conformance`` uses implementations, reference and the ground floor;
- ``aiayn.reproductions`` never imports conformance or benchmarks;
- ``aiayn.benchmarks`` never imports reproductions or conformance;
- only the command line (``aiayn.cli``, ``aiayn.__main__``) sits on top of everything;
- inside ``aiayn.conformance`` each module stands on a floor (:data:`FLOORS`) and imports only from its own floor or
  below: numerics, then budgets, diagnoses, inputs, the equations' records, results, the harness and the process
  boundary, report rows, the checks, the plugin, the test modules, replay and the runner, the studies.

Imports are read from ``import``/``from`` statements anywhere in a module, inside functions too (relative ones
resolved; ``from package import module`` counts as the module), and from ``importlib.import_module("aiayn....")``
calls with a literal or f-string prefix.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: folder -> its package name
ROOMS = {
    "aiayn": "aiayn",
    "reference": "aiayn.reference",
    "implementations": "aiayn.implementations",
    "conformance": "aiayn.conformance",
    "reproductions": "aiayn.reproductions",
    "benchmarks": "aiayn.benchmarks",
}
GROUND = ("aiayn", "aiayn.environment", "aiayn.kit")
TOP = ("aiayn.cli", "aiayn.__main__")

#: package -> the packages (and modules) of ours it may import, besides itself
ALLOWED: dict[str, tuple[str, ...]] = {
    "aiayn.reference": (),
    "ground": GROUND,
    "aiayn.implementations": (*GROUND, "aiayn.reference.counts"),
    "aiayn.conformance": (*GROUND, "aiayn.implementations", "aiayn.reference"),
    "aiayn.reproductions": (*GROUND, "aiayn.implementations", "aiayn.reference"),
    "aiayn.benchmarks": (*GROUND, "aiayn.implementations", "aiayn.reference"),
}


def _module_name(path: Path) -> str:
    folder = path.relative_to(REPO).parts[0]
    rest = path.relative_to(REPO / folder).with_suffix("").parts
    parts = [ROOMS[folder], *[p for p in rest if p != "__init__"]]
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    """Is ``dotted`` one of our modules or packages (a file or folder of the checkout)?"""
    parts = dotted.split(".")
    for folder, package in sorted(ROOMS.items(), key=lambda room: -len(room[1])):  # aiayn.conformance before aiayn
        if dotted == package or dotted.startswith(package + "."):
            rest = parts[len(package.split(".")) :]
            path = REPO.joinpath(folder, *rest)
            return path.with_suffix(".py").exists() or (path / "__init__.py").exists()
    return False


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of an ``aiayn`` name in ``path``."""
    return _imports_of(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")


def _imports_of(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import of an ``aiayn`` name in ``source``, the module ``name``."""
    tree = ast.parse(source)
    package = name if is_package else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [
                (
                    node.lineno,
                    _from_aiayn(alias.name)
                    if module == "aiayn"
                    else (f"{module}.{alias.name}" if _is_module(f"{module}.{alias.name}") else module),
                )
                for alias in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
        ):
            arg = node.args[0]
            text = (
                arg.value
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                else (
                    arg.values[0].value
                    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant)
                    else ""
                )
            )
            if text:
                found.append((node.lineno, text.rstrip(".")))
    return [(line, module) for line, module in found if module == "aiayn" or module.startswith("aiayn.")]


def _from_aiayn(name: str) -> str:
    """``from aiayn import NAME``: the module aiayn.NAME if there is one, else the package aiayn itself."""
    is_module = (
        (REPO / name).is_dir()
        or (REPO / "aiayn" / f"{name}.py").exists()
        or name in {r.split(".")[-1] for r in ROOMS.values()}
    )
    return f"aiayn.{name}" if is_module else "aiayn"


def _room(module: str) -> str:
    if module in GROUND:
        return "ground"
    if module in TOP:
        return "top"
    return ".".join(module.split(".")[:2])


def _within(module: str, allowed: str) -> bool:
    """``module`` is ``allowed`` or inside it (the ground floor's modules match exactly: "aiayn" is not every
    aiayn.*)."""
    return module == allowed or (allowed not in GROUND and module.startswith(allowed + "."))


def _violations(module: str, imports: list[tuple[int, str]]) -> list[tuple[int, str]]:
    room = _room(module)
    if room == "top":
        return []
    return [
        (line, imported)
        for line, imported in imports
        if not (_room(imported) == room or any(_within(imported, a) for a in ALLOWED[room]))
    ]


def _files() -> list[Path]:
    return sorted(p for folder in ROOMS for p in (REPO / folder).rglob("*.py"))


def test_every_room_is_scanned() -> None:
    rooms = {_room(_module_name(p)) for p in _files()}
    assert rooms >= {"ground", "top", *[r for r in ALLOWED if r != "ground"]}, rooms


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_follow_the_layering(path: Path) -> None:
    module = _module_name(path)
    bad = _violations(module, _imports(path))
    room = _room(module)
    assert not bad, (
        f"{path.relative_to(REPO)} ({room}) imports "
        + ", ".join(f"{m} (line {n})" for n, m in bad)
        + f"; allowed: {room} itself and {', '.join(ALLOWED[room]) or 'nothing else of ours'} "
        "(README.md, 'How the code is layered')"
    )


def test_the_rules_can_fail() -> None:
    """Forbidden imports are reported; allowed ones are not."""
    assert _violations("aiayn.reproductions.table2", [(1, "aiayn.conformance.run.harness")]) == [
        (1, "aiayn.conformance.run.harness")
    ]
    assert _violations("aiayn.benchmarks.report", [(2, "aiayn.reproductions.table1")]) == [
        (2, "aiayn.reproductions.table1")
    ]
    assert _violations("aiayn.reference.layers", [(3, "aiayn.kit")]) == [(3, "aiayn.kit")]
    assert _violations("aiayn.implementations.numpy_impl", [(4, "aiayn.reference.layers")]) == [
        (4, "aiayn.reference.layers")
    ]
    assert _violations("aiayn.kit", [(5, "aiayn.cli")]) == [(5, "aiayn.cli")]
    assert _violations("aiayn.conformance.run.harness", [(6, "aiayn.kit"), (7, "aiayn.reference.attention")]) == []
    assert _violations("aiayn.cli", [(8, "aiayn.reproductions.runner")]) == []


# --------------------------------------------------------------------------------------------
# inside the conformance suite

#: The floors of ``aiayn.conformance``, lowest first: a module imports only modules of its own floor or below, so
#: the records (``equations``) never reach up into the harness or the checks, and the diagnoses never into the
#: records. An entry names a module, or a package and everything in it; the test modules are ``test_*``.
FLOORS: tuple[tuple[str, ...], ...] = (
    (
        "aiayn.conformance",
        "aiayn.conformance.directions",
        "aiayn.conformance.numerics",
        "aiayn.conformance.report",
        "aiayn.conformance.run",
    ),
    ("aiayn.conformance.budgets",),
    ("aiayn.conformance.diagnoses",),
    ("aiayn.conformance.inputs",),
    ("aiayn.conformance.equations",),
    ("aiayn.conformance.report.results", "aiayn.conformance.report.coverage"),
    ("aiayn.conformance.run.isolation", "aiayn.conformance.run.autodiff", "aiayn.conformance.run.failures"),
    ("aiayn.conformance.run.boundary",),
    ("aiayn.conformance.run.gradients", "aiayn.conformance.run.declarations", "aiayn.conformance.run.harness"),
    ("aiayn.conformance.run.comparison",),
    ("aiayn.conformance.report.rows",),
    ("aiayn.conformance.checks",),
    ("aiayn.conformance.report.traceability", "aiayn.conformance.run.plugin"),
    ("aiayn.conformance.test_*",),
    ("aiayn.conformance.replay", "aiayn.conformance.run.runner"),
    ("aiayn.conformance.studies",),
)


def _floor(module: str) -> int | None:
    """The floor of a conformance module: that of the longest entry naming it (exactly for a role folder's package
    itself, ``aiayn.conformance.run``: its ``__init__`` holds a docstring only)."""
    best: tuple[int, int] | None = None
    for level, entries in enumerate(FLOORS):
        for entry in entries:
            exact_only = entry.count(".") == 2 and entry.rsplit(".", 1)[-1] in ("report", "run")
            if entry.endswith("*"):
                hit = module.startswith(entry[:-1])
            elif exact_only or entry == "aiayn.conformance":
                hit = module == entry
            else:
                hit = module == entry or module.startswith(entry + ".")
            if hit and (best is None or len(entry) > best[1]):
                best = (level, len(entry))
    return None if best is None else best[0]


def _floor_violations(module: str, imports: list[tuple[int, str]]) -> list[tuple[int, str]]:
    here = _floor(module)
    return [
        (line, imported)
        for line, imported in imports
        if imported.startswith("aiayn.conformance") and here is not None and (_floor(imported) or 0) > here
    ]


_SUITE = sorted((REPO / "conformance").rglob("*.py"))


@pytest.mark.parametrize("path", _SUITE, ids=lambda p: str(p.relative_to(REPO)))
def test_conformance_imports_stay_on_their_floor(path: Path) -> None:
    module = _module_name(path)
    here = _floor(module)
    assert here is not None, f"{module} stands on no floor of FLOORS: add it where its imports put it"
    bad = _floor_violations(module, _imports(path))
    assert not bad, (
        f"{path.relative_to(REPO)} (floor {here}: {', '.join(FLOORS[here])}) imports from above it: "
        + ", ".join(f"{m} (line {n}, floor {_floor(m)})" for n, m in bad)
        + " (tests/test_layering.py, FLOORS; pass what is needed down as a function or a hook instead)"
    )


def test_a_planted_upward_import_inside_the_suite_fails() -> None:
    """An upward import fails at module level and inside a function, and ``from package import module`` counts as
    the module; imports from below pass."""
    planted = "def budget_at():\n    from aiayn.conformance.run.harness import floored\n    return floored\n"
    assert _floor_violations("aiayn.conformance.equations", _imports_of(planted, "aiayn.conformance.equations")) == [
        (2, "aiayn.conformance.run.harness")
    ]
    planted = "from aiayn.conformance.run import plugin\n"
    assert _floor_violations("aiayn.conformance.checks.contract", _imports_of(planted, "x")) == [
        (1, "aiayn.conformance.run.plugin")
    ]
    planted = "from aiayn.conformance.equations import record\n"
    assert _floor_violations("aiayn.conformance.diagnoses.forward", _imports_of(planted, "x")) == [
        (1, "aiayn.conformance.equations")
    ]
    below = "from aiayn.conformance.numerics import floored\nfrom aiayn.conformance.budgets import forward as B\n"
    assert _floor_violations("aiayn.conformance.equations", _imports_of(below, "x")) == []
