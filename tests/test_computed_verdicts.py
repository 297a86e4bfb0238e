"""No verdict in reproductions/ is written down: each is a comparison, and flips when its input does.

- The verdict-flip tests: every verdict function of ``reproductions/seeds.py`` (and the ablation's
  in ``translation/ablation_report.py``, tested in test_translation.py) gives one verdict on one
  input and another when the compared quantity crosses the criterion, and the claims that use them
  change verdict when the number they compare changes (monkeypatched inputs).
- The structural test: no function under reproductions/ returns a verdict constant (or a tuple
  ending in one) without comparing anything, and no seed claim's compute is a lambda ending in a
  verdict constant.
"""

from __future__ import annotations

import ast
from fractions import Fraction
from pathlib import Path

import pytest

from aiayn.reproductions import seeds
from aiayn.reproductions.seeds import (
    DIFFERS,
    MATCHES_PAPER,
    PAPER_DIFFERS,
    QUALIFIED,
    REPRODUCED,
    ffn_share_verdict,
    fraction_verdict,
    margin_verdict,
    saturation_verdict,
)

REPRODUCTIONS = Path(seeds.__file__).resolve().parent
VERDICT_NAMES = {
    "REPRODUCED",
    "DIFFERS",
    "QUALIFIED",
    "NOT_CHECKABLE",
    "MATCHES_PAPER",
    "PAPER_DIFFERS",
    "AGREES",
    "DISAGREES",
    "NOT_SEPARABLE",
}


def test_ffn_share_verdict_flips_at_its_criterion() -> None:
    """ "about 2/3" is [7/12, 3/4): the paper's model inside it reproduces; only a decoder-only stack
    inside it qualifies; neither differs. The edges are where the criterion puts them."""
    assert ffn_share_verdict(Fraction(2, 3), Fraction(1, 2)) == REPRODUCED
    assert ffn_share_verdict(Fraction(7, 12), Fraction(1, 2)) == REPRODUCED
    assert ffn_share_verdict(Fraction(4, 7), Fraction(2, 3)) == QUALIFIED  # 4/7 < 7/12
    assert ffn_share_verdict(Fraction(3, 4), Fraction(2, 3)) == QUALIFIED  # 3/4 is outside (half-open)
    assert ffn_share_verdict(Fraction(4, 7), Fraction(1, 2)) == DIFFERS


def test_fraction_verdict_flips_at_one() -> None:
    assert fraction_verdict(Fraction(23, 120)) == REPRODUCED
    assert fraction_verdict(Fraction(1)) == DIFFERS and fraction_verdict(Fraction(6, 5)) == DIFFERS


def test_saturation_verdict_flips_with_each_share() -> None:
    assert saturation_verdict(0.95, 0.92) == REPRODUCED
    assert saturation_verdict(0.95, 0.88) == QUALIFIED
    assert saturation_verdict(0.90, 0.95) == DIFFERS  # "above 0.9" is strict


def test_margin_verdict_flips_at_the_claimed_margin() -> None:
    assert margin_verdict(Fraction(21, 10), Fraction(2)) == REPRODUCED
    assert margin_verdict(Fraction(2), Fraction(2)) == DIFFERS


def test_claims_change_verdict_when_their_input_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The claims compute from their inputs: the seed's worked numbers against a changed oracle value, the
    FFN share against a changed parameter breakdown, the cost fraction against a changed printed cost."""
    claims = {c.quote: c for c in seeds.claims()}
    ffn = claims["feed-forward layers hold about two-thirds of a Transformer's parameters"]
    cost = claims["a fraction of what the previous best cost to train"]
    margin = claims["28.4 BLEU, beating every previous model by more than 2 points"]
    e2 = claims["e^2.0 = 7.39"]
    big28 = claims["28.4 BLEU on English→German"]
    assert ffn.compute()[2] == QUALIFIED and cost.compute()[2] == REPRODUCED and margin.compute()[2] == REPRODUCED
    assert e2.compute()[2] == REPRODUCED and big28.compute()[2] == MATCHES_PAPER

    real_breakdown = seeds.parameter_breakdown

    def ffn_heavy(*args, **kwargs):  # the FFNs made two-thirds of the non-embedding parameters
        parts = real_breakdown(*args, **kwargs)
        rest = sum(v for k, v in parts.items() if k != "embedding" and "feed_forward" not in k)
        parts["encoder.feed_forward"], parts["decoder.feed_forward"] = rest, rest
        return parts

    monkeypatch.setattr(seeds, "parameter_breakdown", ffn_heavy)
    assert ffn.compute()[2] == REPRODUCED
    monkeypatch.setattr(seeds.math, "exp", lambda x: 7.0)
    assert e2.compute()[2] == DIFFERS

    real_printed = seeds.paper.printed

    def printed(key: str):
        p = real_printed(key)
        if key == "table2.MoE.cost_en_fr":
            return type(p)(**{**p.__dict__, "value": 1.0e19, "text": "1.0·10^19"})
        if key.endswith(".bleu_en_de") and key.startswith("table2.Transformer (big)"):
            return type(p)(**{**p.__dict__, "value": 27.0, "text": "27.0"})
        return p

    monkeypatch.setattr(seeds.paper, "printed", printed)
    assert cost.compute()[2] == DIFFERS, "big's cost above the previous best's must not be 'a fraction'"
    assert margin.compute()[2] == DIFFERS and big28.compute()[2] == PAPER_DIFFERS


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node


def _constant_verdict(value: ast.AST | None) -> bool:
    """A verdict constant, or a tuple whose last element is one (the (computed, unrounded, verdict) form)."""
    if isinstance(value, ast.Tuple) and value.elts:
        value = value.elts[-1]
    return isinstance(value, ast.Name) and value.id in VERDICT_NAMES


def test_no_verdict_is_written_down() -> None:
    """Every function (or lambda) under reproductions/ that hands out a verdict constant also compares something."""
    offenders = []
    for path in sorted(REPRODUCTIONS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in _functions(tree):
            body = [fn.body] if isinstance(fn, ast.Lambda) else fn.body
            returns = (
                [fn.body]
                if isinstance(fn, ast.Lambda)
                else [n.value for n in ast.walk(ast.Module(body=body, type_ignores=[])) if isinstance(n, ast.Return)]
            )
            if any(_constant_verdict(r) for r in returns):
                compares = any(
                    isinstance(n, (ast.Compare, ast.IfExp, ast.If))
                    for b in body
                    for n in ast.walk(b if isinstance(b, ast.AST) else b)
                )
                if not compares:
                    name = getattr(fn, "name", "<lambda>")
                    offenders.append(f"{path.relative_to(REPRODUCTIONS)}:{fn.lineno} {name}")
    assert not offenders, f"verdicts written as constants: {offenders}"


def test_the_structural_check_catches_a_constant_verdict() -> None:
    """The check above must fail on the two shapes the audit found (a tuple ending in a constant, a bare return)."""
    bad = ast.parse("def _f():\n    return 'x', 'y', QUALIFIED\nclaim = lambda: ('x', 'y', REPRODUCED)\n")
    found = [
        fn
        for fn in _functions(bad)
        if any(
            _constant_verdict(r)
            for r in (
                [fn.body]
                if isinstance(fn, ast.Lambda)
                else [n.value for n in ast.walk(fn) if isinstance(n, ast.Return)]
            )
        )
    ]
    assert len(found) == 2
