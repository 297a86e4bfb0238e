"""No verdict in reproductions/ is written down: each is a comparison, and flips when its input does.

- The verdict-flip tests: every verdict function of ``reproductions/seeds.py`` (and the ablation's
  in ``translation/ablation_report.py``, tested in test_translation.py) gives one verdict on one
  input and another when the compared quantity crosses the criterion, and every claim seeds.md
  checks changes verdict when what it compares changes (``FLIPS``: each oracle function, config,
  printed record or sampler a claim reads, monkeypatched; a test checks that together they reach
  every claim).
- The structural test: no function under reproductions/ returns a verdict constant (or a tuple
  ending in one) without comparing anything, and no seed claim's compute is a lambda ending in a
  verdict constant.
"""

from __future__ import annotations

import ast
import dataclasses
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from aiayn.reproductions import seeds
from aiayn.reproductions.seeds import (
    DIFFERS,
    MATCHES_PAPER,
    PAPER_DIFFERS,
    QUALIFIED,
    REPRODUCED,
    complexity_verdict,
    ffn_share_verdict,
    fraction_verdict,
    margin_verdict,
    order_exponents,
    saturation_verdict,
    spread_verdict,
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


# ---------------------------------------------------------------------------------------------
# Every seeds.md verdict flips when what it compares changes
# ---------------------------------------------------------------------------------------------


def _scaled(fn, factor: float):
    return lambda *args, **kwargs: fn(*args, **kwargs) * factor


def _patch_layer_operations(mp: pytest.MonkeyPatch) -> None:
    """One more sequential step and path step everywhere; self-attention twice as dear."""
    real = seeds.layer_operations

    def changed(layer_type, n, d, **kwargs):
        ops = real(layer_type, n, d, **kwargs)
        return dataclasses.replace(
            ops,
            sequential_operations=ops.sequential_operations + 1,
            maximum_path_length=ops.maximum_path_length + 1,
            complexity=ops.complexity * (2 if layer_type == "self_attention" else 1),
        )

    mp.setattr(seeds, "layer_operations", changed)


def _patch_breakdown(mp: pytest.MonkeyPatch) -> None:
    """Each FFN a quarter of its size (the FFN share falls below 7/12 in every stack); the embedding doubled."""
    real = seeds.parameter_breakdown

    def changed(*args, **kwargs):
        parts = real(*args, **kwargs)
        return {k: v // 4 if "feed_forward" in k else 2 * v if k == "embedding" else v for k, v in parts.items()}

    mp.setattr(seeds, "parameter_breakdown", changed)


def _patch_positional(mp: pytest.MonkeyPatch) -> None:
    """Sines and cosines swapped in every pair of columns."""
    real = seeds.positional_encoding

    def changed(*args, **kwargs):
        table = real(*args, **kwargs)
        return table.reshape(*table.shape[:-1], -1, 2)[..., ::-1].reshape(table.shape)

    mp.setattr(seeds, "positional_encoding", changed)


_PRINTED_CHANGES = {
    "s5.2.big.days": "4 days",
    "s5.2.base.hours": "13 hours",
    "table2.Transformer (big).bleu_en_de": "27.0",
    "table2.Transformer (big).bleu_en_fr": "41.0",
    "table2.ConvS2S.cost_en_de": "9.7·10^18",
    "table2.MoE.cost_en_fr": "1.0·10^19",
    "table3.A1.BLEU": "25.0",
    "table1.self_attention.complexity": "O(n·d²)",
}


def _patch_paper(mp: pytest.MonkeyPatch) -> None:
    """Printed records changed: text, and the value the text stands for."""
    real = seeds.paper.printed

    def changed(key: str):
        p = real(key)
        text = _PRINTED_CHANGES.get(key)
        if text is None:
            return p
        value = text if text.startswith("O(") else float(text.split()[0].replace("·10^", "e"))
        return dataclasses.replace(p, text=text, value=value)

    mp.setattr(seeds.paper, "printed", changed)


def _patch_saturation(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        seeds.saturation,
        "via_chi",
        lambda *args, **kwargs: {"unscaled_max_share_mean": 0.85, "unscaled_max_share_se": 0.001},
    )


def _patch(name: str, value_of) -> callable:
    return lambda mp: mp.setattr(seeds, name, value_of(getattr(seeds, name)))


#: name -> (what changes, the claims (quotes) whose verdict must change with it). Each claim's verdict is
#: compared before and after; together the changes must reach every claim seeds.md checks.
FLIPS = {
    "layer_operations": (
        _patch_layer_operations,
        {
            "“down” reaches “The” only after surviving three hand-offs",
            "an RNN computes four steps in a strict chain",
            "“down” can look at “The” in a single step",
            "past n = 512 the balance flips (n < d = 512)",
        },
    ),
    "sublayer_connection": (
        _patch("sublayer_connection", lambda f: _scaled(f, 2.0)),
        {
            "the residual adds them: (3, 1)",
            "the mean is 2",
            "the standard deviation is 1",
            "LayerNorm((2, 0) + (1, 1)) = (1, −1)",
        },
    ),
    "layer_norm": (_patch("layer_norm", lambda f: lambda *a, **k: f(*a, **k) + 1.0), {"LayerNorm((3, 1)) = (1, −1)"}),
    "softmax": (
        _patch("softmax", lambda f: lambda x, *a, **k: np.full_like(x, 1 / np.shape(x)[-1])),
        {
            "softmax(2.0, 1.0, 0.5): “animal” gets 0.63",
            "softmax(2.0, 1.0, 0.5): “tired” gets 0.23",
            "softmax(2.0, 1.0, 0.5): “street” gets 0.14",
        },
    ),
    "exp": (
        lambda mp: mp.setattr(seeds.math, "exp", lambda x: 7.0),
        {"e^2.0 = 7.39", "e^1.0 = 2.72", "e^0.5 = 1.65", "e^2.0 + e^1.0 + e^0.5 total 11.76"},
    ),
    "scaled_dot_product_attention": (
        _patch("scaled_dot_product_attention", lambda f: lambda q, *a, **k: f(2 * np.asarray(q), *a, **k)),
        {
            "0.63·V(animal) + 0.23·V(tired) + 0.14·V(street), V one-hot",
            "after dividing by 8 they typically swing by about 1",
            "dividing by √d_k: √64 = 8",
        },
    ),
    "BASE": (
        _patch("BASE", lambda b: dataclasses.replace(b, d_model=256, d_k=32, d_v=32)),
        {
            "d_k = 64: raw scores typically swing by √64 = 8.0",
            "each head sees 10 × 64",
            "h = 8 heads over 512 / 8 = 64 numbers each",
            "h = 8 heads with d_k = d_v = d_model/h = 64 (d_model = 512)",
            "feed-forward layers hold about two-thirds of a Transformer's parameters",
            "√d_model = √512 ≈ 22.6",
            "round(d_model ** -0.5, 4) → 0.0442",
        },
    ),
    "multi_head_attention": (
        _patch("multi_head_attention", lambda f: lambda *a, **k: f(*a, **k)[..., :-1]),
        {"eight heads concatenated give 10 × 512"},
    ),
    "multi_head_attention_parameters": (
        _patch("multi_head_attention_parameters", lambda f: _scaled(f, 2)),
        {"projection weights total 4 × 512 × 512", "about twice the attention layer's projections"},
    ),
    "feed_forward": (
        _patch("feed_forward", lambda f: _scaled(f, 2.0)),
        {"x W₁ = (1, −1, −2)", "ReLU gives (1, 0, 0)", "FFN(1, −1) = (2, 0)"},
    ),
    "feed_forward_parameters": (
        _patch("feed_forward_parameters", lambda f: _scaled(f, 2)),
        {"2 × 512 × 2048 + 2048 + 512 parameters per layer"},
    ),
    "embedding_lookup": (_patch("embedding_lookup", lambda f: _scaled(f, 2.0)), {"√d_model = √512 ≈ 22.6"}),
    "parameter_breakdown": (
        _patch_breakdown,
        {"E is 37,000 × 512 numbers", "feed-forward layers hold about two-thirds of a Transformer's parameters"},
    ),
    "parameter_count": (_patch("parameter_count", lambda f: _scaled(f, 2)), {"sharing saves two more copies of that"}),
    "positional_encoding": (
        _patch_positional,
        {
            "PE(1, 0) = 0.841",
            "PE(1, 1) = 0.540",
            "PE(1, 2) = 0.822",
            "PE(1, 3) = 0.570",
            "PE(10, 128) = 0.841",
            "the i = 1 pair divides by 1.0366",
            "pair i = 64 has 10000^(128/512) = 10",
        },
    ),
    "lrate": (
        _patch("lrate", lambda f: _scaled(f, 2.0)),
        {
            "round(d_model ** -0.5, 4) → 0.0442",
            "round(4000 ** -0.5, 4) → 0.0158",
            "peak lrate(4000), in units of 10^-4 → 7.0",
            "lrate(100,000), in units of 10^-4 → 1.4",
        },
    ),
    "label_smoothing": (
        _patch("label_smoothing", lambda f: lambda target, k, eps: f(target, k, 2 * eps)),
        {
            "smoothed correct token, ε_ls = 0.1, K = 37,000 → 0.900003",
            "every other token → 0.0000027",
        },
    ),
    "training_flops": (_patch("training_flops", lambda f: _scaled(f, 2.0)), {"the base Transformer's cost"}),
    "paper": (
        _patch_paper,
        {
            "the big model trained in 3.5 days on 8 GPUs",
            "28.4 BLEU on English→German",
            "41.8 on English→French",
            "3.3 × 10¹⁸ FLOPs, against 9.6 × 10¹⁸ for ConvS2S",
            "one head is 0.9 BLEU worse than the best setting",
            "the big model adds another point",
            "28.4 BLEU, beating every previous model by more than 2 points",
            "41.8 BLEU after 3.5 days on 8 GPUs",
            "a fraction of what the previous best cost to train",
            "the smaller base model was trained in just 12 hours",
            "standard self-attention has O(n²) time complexity",
        },
    ),
    "saturation": (
        _patch_saturation,
        {"at d_k = 512 without scaling, the largest share averages above 0.9"},
    ),
}


@pytest.fixture(scope="module")
def seed_verdicts() -> dict[str, str]:
    """Every checkable claim's verdict as seeds.md shows it."""
    return {c.quote: c.compute()[2] for c in seeds.claims() if c.compute is not None}


@pytest.mark.parametrize("name", sorted(FLIPS))
def test_each_seed_verdict_flips_when_its_input_changes(
    name: str, seed_verdicts: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    patch, quotes = FLIPS[name]
    claims = {c.quote: c for c in seeds.claims()}
    patch(monkeypatch)
    unchanged = [q for q in sorted(quotes) if claims[q].compute()[2] == seed_verdicts[q]]
    assert not unchanged, f"{name} changed, yet these claims keep their verdict: {unchanged}"


def test_the_flips_reach_every_seed_verdict(seed_verdicts: dict[str, str]) -> None:
    """No claim of seeds.md is left out of the flips above (a verdict no input can change is a constant)."""
    reached = set().union(*(quotes for _, quotes in FLIPS.values()))
    assert reached <= set(seed_verdicts), f"unknown claims: {sorted(reached - set(seed_verdicts))}"
    assert set(seed_verdicts) <= reached, f"claims no change reaches: {sorted(set(seed_verdicts) - reached)}"


def test_spread_verdict_needs_the_closed_form_and_the_sample() -> None:
    """The closed form decides the printed digits; the sampled mean square must lie within SPREAD_Z SDs of it."""
    assert spread_verdict("8.0", 8.0, 64.1, 0.1) == REPRODUCED
    assert spread_verdict("8.0", 8.06, 64.1, 0.1) == DIFFERS  # rounds to 8.1
    assert spread_verdict("8.0", 8.0, 64.0 + 5.01 * 0.1, 0.1) == DIFFERS


def test_saturation_verdict_judges_each_mean_by_its_standard_error() -> None:
    """A mean counts as above the level only when it is more than SATURATION_Z standard errors above it."""
    assert saturation_verdict(0.95, 0.92, se_short=0.001, se_long=0.001) == REPRODUCED
    assert saturation_verdict(0.95, 0.92, se_short=0.001, se_long=0.005) == QUALIFIED  # 4 SE above
    assert saturation_verdict(0.92, 0.95, se_short=0.005, se_long=0.001) == DIFFERS


def test_complexity_verdict_compares_the_orders() -> None:
    """Equal orders match; the same exponent of n with the paper's other factors held fixed qualifies; another
    exponent of n differs. A substring is not a match: O(n²) is not O(n²·d)."""
    assert complexity_verdict("O(n²·d)", "O(n²·d)") == MATCHES_PAPER
    assert complexity_verdict("O(n²)", "O(n²·d)") == QUALIFIED
    assert complexity_verdict("O(n²)", "O(n·d²)") == PAPER_DIFFERS
    assert order_exponents("O(k·n·d²)") == {"k": 1, "n": 1, "d": 2}
    with pytest.raises(ValueError, match="monomial"):
        order_exponents("O(k·n·d + n·d²)")
