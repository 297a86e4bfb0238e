"""The code hash in every signature, and the staleness it lets the registry flag.

- ``aiayn.kit.code_closure`` follows every import of aiayn modules (also inside functions, relative ones
  resolved), leaves out the ground floor, and ``code_hash`` changes when the code of any module in the
  closure does (not its layout, comments or docstrings);
- the registry calls a measured report current only when every stored code hash equals its
  measurement module's current one, and the report's own line says STALE otherwise;
- every signature names the commit and the code.
"""

from __future__ import annotations

import pytest

from aiayn import kit


def _fake_sources(monkeypatch: pytest.MonkeyPatch, sources: dict[str, bytes]) -> None:
    monkeypatch.setattr(
        kit,
        "_source",
        lambda module: (f"/fake/{module.replace('.', '/')}.py", sources[module]) if module in sources else None,
    )


def test_closure_follows_imports_and_skips_the_ground_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_sources(
        monkeypatch,
        {
            "aiayn.pkg.a": b"import aiayn.pkg.b\nfrom aiayn.kit import Report\nimport numpy\n",
            "aiayn.pkg.b": b"def f():\n    from . import c\n    return c\n",
            "aiayn.pkg.c": b"from aiayn.environment import require\n",
            "aiayn.pkg": b"",
        },
    )
    assert kit.code_closure("aiayn.pkg.a") == ["aiayn.pkg", "aiayn.pkg.a", "aiayn.pkg.b", "aiayn.pkg.c"]
    assert kit.code_closure("aiayn.kit") == []


def test_code_hash_moves_with_any_module_of_the_closure(monkeypatch: pytest.MonkeyPatch) -> None:
    sources = {"aiayn.pkg.a": b"import aiayn.pkg.b\n", "aiayn.pkg.b": b"x = 1\n", "aiayn.other": b"y = 2\n"}
    _fake_sources(monkeypatch, sources)
    first = kit.code_hash("aiayn.pkg.a")
    assert len(first) == 12 and first == kit.code_hash("aiayn.pkg.a")
    sources["aiayn.other"] = b"y = 3\n"  # outside the closure: no change
    assert kit.code_hash("aiayn.pkg.a") == first
    sources["aiayn.pkg.b"] = b"x = 2\n"  # inside: a new hash
    assert kit.code_hash("aiayn.pkg.a") != first


def test_code_hash_ignores_layout_comments_and_docstrings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reformatted, re-commented or re-documented module ran the same code: same hash; a changed string or
    name that the code uses is new code."""
    sources = {"aiayn.pkg.a": b'"""Doc."""\ndef f(x):\n    """Doc."""\n    return g(x, "s")\n'}
    _fake_sources(monkeypatch, sources)
    first = kit.code_hash("aiayn.pkg.a")
    sources["aiayn.pkg.a"] = (
        b'"""Other doc,\nlonger."""\n\n\ndef f(x):  # a comment\n    return g(\n        x,\n        "s",\n    )\n'
    )
    assert kit.code_hash("aiayn.pkg.a") == first
    sources["aiayn.pkg.a"] = b'def f(x):\n    return g(x, "t")\n'
    assert kit.code_hash("aiayn.pkg.a") != first
    sources["aiayn.pkg.a"] = b'def f(y):\n    return g(y, "s")\n'
    assert kit.code_hash("aiayn.pkg.a") != first


def test_real_closures_hold_what_computes_the_numbers() -> None:
    """The training run's hash covers the model, the loop, the decoder, the scorer and the checked equations;
    not the report that renders it, nor the ground floor."""
    closure = kit.code_closure("aiayn.reproductions.translation.run")
    for module in (
        "aiayn.reproductions.translation.model",
        "aiayn.reproductions.translation.train",
        "aiayn.reproductions.translation.decode",
        "aiayn.reproductions.bleu_scoring",
        "aiayn.implementations.torch_impl",
    ):
        assert module in closure, f"{module} missing from the training run's code closure"
    for module in (
        "aiayn.reproductions.translation.report",
        "aiayn.kit",
        "aiayn.environment",
        "aiayn.reproductions.registry",
    ):
        assert module not in closure, f"{module} should not make a training run stale"
    assert "aiayn.reproductions.translation.ablation_report" not in kit.code_closure(
        "aiayn.reproductions.translation.ablation"
    )


def test_registry_flags_a_changed_measurement_as_stale() -> None:
    from aiayn.reproductions.registry import BY_NAME, staleness_line, status

    r = BY_NAME["bleu-ablation"]
    now = kit.code_hash(r.measurement)
    assert status(r, {"measurement": {"codes": [now], "commits": ["abc"]}})["state"] == "current"
    assert status(r, {"measurement": {"codes": [now, "0" * 12], "commits": ["abc"]}})["state"] == "stale"
    assert status(r, None)["state"] == "missing" and status(BY_NAME["table2"], None)["state"] == "deterministic"
    assert staleness_line(r, {"codes": ["0" * 12], "commits": ["abc"]}).startswith("**STALE:**")
    assert "(current)" in staleness_line(r, {"codes": [now], "commits": ["abc"]})


def test_signatures_name_commit_and_code() -> None:
    sig = kit.signature("x", packages=(), code="0123456789ab", precision="float64")
    assert "|commit:" in sig and "|code:0123456789ab|" in sig and sig.startswith("report:x|python:")
    assert "|code:" in kit.signature("y", packages=())  # by default, the caller's code
