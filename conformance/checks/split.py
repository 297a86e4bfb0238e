"""Split keys (§3.2.1): Eq. (1) over blocks of keys, merged by their log-sum-exps (split-KV, as FlashDecoding and
paged-attention kernels compute it).

The identity is proven in ``aiayn.reference.attention`` ("split keys"): for any partition of the keys, merging the
blocks' outputs O_p with the weights softmax_p(L_p) of their log-sum-exps gives Eq. (1) over all the keys, and
log sum_p exp(L_p) its log-sum-exp. An implementation may provide the two methods of its record's ``split``
(``implementations/protocol.py``, "Split keys"); without them the row reads "not provided". Three checks:

- ``attention_with_lse``: one block against the oracle: the output within Eq. (1)'s bound (0 for a query that sees
  no key of the block), the log-sum-exp within its bound and exactly -inf where no key is visible
  (``budgets/split.py``);
- ``merge_attention_states``: drawn states (up to 4 blocks, log-sum-exps up to 1e4 apart from 0, empty blocks)
  merged, against the oracle's merge;
- ``attention_over_split_keys_equals_the_whole`` (a property): the implementation's own blocks merged by its own
  merge, against the oracle's Eq. (1) over all the keys and its log-sum-exp, within the bound of blocks merged.

A failing agreement names the bug of ``diagnoses/split.py`` its output matches (a merge that forgets to renormalise,
...). Results are judged as any other: a pair of native arrays, the output in the call's dtype, the log-sum-exp in
it or in float32 (FlashAttention's kernels keep it in float32 for half-precision calls), every value a number of
that dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiayn.conformance.checks._common import prepare
from aiayn.conformance.diagnoses.split import SplitDiagnosis
from aiayn.conformance.directions import SPLIT
from aiayn.conformance.equations import record
from aiayn.conformance.numerics import floored, precision
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check, timed

__all__ = [
    "attention_over_split_keys_equals_the_whole",
    "attention_with_lse",
    "merge_attention_states",
    "PAGED",
    "paged_attention",
    "provided",
]

_EQ = record("scaled_dot_product_attention")
_SPLIT = _EQ.split
assert _SPLIT is not None
#: The paged method, for the tests' "not provided".
PAGED = (_SPLIT.paged,)

#: What a failure of the split property breaks.
VIOLATES = (
    "Eq. (1) over all the keys is the merge of Eq. (1) over blocks of them by their log-sum-exps (§3.2.1; the "
    "identity in reference/attention.py, split keys)"
)

#: The dtypes a log-sum-exp may come back in, beside the call's: float32 for a half-precision call.
_WIDER_LSE = {"float16": "float32", "bfloat16": "float32"}


def provided(impl: Any, methods: tuple[str, ...] = _SPLIT.methods) -> None:
    """Skip as "not provided" unless ``impl`` has ``methods`` (the record's split methods; its paged one for the paged
    check): the tests call it before they draw, the checks again (a fixed case, a replayed check)."""
    import pytest

    missing = [m for m in methods if not callable(getattr(impl, m, None))]
    if missing:  # reported "not provided" in the split row, never counted as a pass
        pytest.skip(f"not provided: {getattr(impl, 'name', impl)} has no {', '.join(missing)}")


def _pair(case: Case, method: str, natives: list[Any], out_shape: tuple, lse_shape: tuple) -> tuple:
    """One call of ``method``: (out, lse) as float64, each checked in type, shape and dtype."""
    answer = case.call(method, *natives)
    if not isinstance(answer, tuple) or len(answer) != 2:
        case.fail(f"{method} returned {type(answer).__name__}, expected a pair (out, lse) of native arrays")
    out = case.numpy(answer[0], f"{method}(...)[0]")
    lse = case.numpy(answer[1], f"{method}(...)[1]")
    for what, got, want in (("out", out, out_shape), ("lse", lse, lse_shape)):
        if not isinstance(got, np.ndarray) or got.dtype.kind != "f" or got.shape != want:
            shown = f"{getattr(got, 'dtype', type(got).__name__)} of shape {getattr(got, 'shape', None)}"
            case.fail(f"{method} returned {what} as {shown}, expected a float array of shape {want}")
    case._check_native_dtype(answer[0], out, case.dtype, f"{method} (out)")
    lse_dtype = case.dtype
    wider = _WIDER_LSE.get(case.dtype)
    if wider is not None and case.native_dtype_name(getattr(answer[1], "dtype", None)) == wider:
        lse_dtype = wider
    case._check_native_dtype(answer[1], lse, lse_dtype, f"{method} (lse)")
    return out, lse


def _thresholds(bounds: Any, dtype: str, expected: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The comparison thresholds of (out, lse): the bounds at the dtype plus at float64 (the oracle's share), floored
    at one ulp of the dtype at the expected value. ``bounds(p)`` gives (out bound, lse bound) at precision p."""
    here, ours = bounds(precision(dtype)), bounds(precision("float64"))
    return tuple(floored(np.asarray(a) + np.asarray(b), dtype, e) for a, b, e in zip(here, ours, expected))


def _judge(case: Case, method: str, got: tuple, expected: tuple, bounds: Any, a: dict, what: str) -> None:
    """Compare (out, lse) with the oracle's within ``bounds`` (at the case's arithmetic), naming the bug each result
    matches where one fails (``diagnoses/split.py``: ``a`` is what the bug is computed from)."""
    out_b, lse_b = _thresholds(bounds, case.arithmetic, expected)
    for result, g, e, b in (("out", got[0], expected[0], out_b), ("lse", got[1], expected[1], lse_b)):
        if case.kind == "agreement":

            def budget_at(dtype: str, e: Any = e, i: int = 0 if result == "out" else 1) -> np.ndarray:
                return _thresholds(bounds, dtype, expected)[i]

            role = {_SPLIT.block: "block", _SPLIT.merge: "merge", _SPLIT.paged: "paged"}[method]
            case.diagnosis = SplitDiagnosis(role, result, {**a, "lse": e}, e, budget_at)
        compare(case, g, e, b, what=f"{what}: its {result} disagrees with the oracle", budget_name=_SPLIT.budget_name)
    case.diagnosis = None


@check("scaled_dot_product_attention", direction=SPLIT)
def attention_with_lse(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any) -> None:
    """One block: (out, lse) against the oracle's ``attention_with_lse`` within ``budgets.split.attention_with_lse``."""
    provided(case.impl)
    natives, seen = prepare(case, q=q, k=k, v=v, mask=mask)
    shape = np.broadcast_shapes(seen["q"].shape[:-2], seen["k"].shape[:-2], seen["v"].shape[:-2])
    n_q, d_v = seen["q"].shape[-2], seen["v"].shape[-1]
    got = _pair(case, _SPLIT.block, [natives[n] for n in ("q", "k", "v", "mask")], (*shape, n_q, d_v), (*shape, n_q))
    with timed("oracle"):
        expected = _SPLIT.block_oracle(seen)
    _judge(case, _SPLIT.block, got, expected, lambda p: _SPLIT.block_budget(seen, p), seen, "the block")


@check("scaled_dot_product_attention", direction=SPLIT)
def merge_attention_states(case: Case, outs: np.ndarray, lses: np.ndarray) -> None:
    """Drawn states merged: (out, lse) against the oracle's ``merge_attention_states`` within
    ``budgets.split.merged``."""
    provided(case.impl)
    natives, seen = prepare(case, outs=outs, lses=lses)
    got = _pair(case, _SPLIT.merge, [natives["outs"], natives["lses"]], seen["outs"].shape[1:], seen["lses"].shape[1:])
    with timed("oracle"):
        expected = _SPLIT.merge_oracle(seen["outs"], seen["lses"])
    bounds = lambda p: _SPLIT.merge_budget(seen["outs"], seen["lses"], p)  # noqa: E731
    _judge(case, _SPLIT.merge, got, expected, bounds, seen, "the merge")


@check("scaled_dot_product_attention", kind="property", violates=VIOLATES, direction=SPLIT)
def attention_over_split_keys_equals_the_whole(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any, edges: tuple[int, ...]
) -> None:
    """The implementation's blocks (cut at ``edges``) merged by its own merge equal the oracle's Eq. (1) over all the
    keys ("zeros" where a query sees no key at all) and its log-sum-exp, within ``budgets.split.split_attention``."""
    provided(case.impl)
    n_k = k.shape[-2]
    shape = np.broadcast_shapes(q.shape[:-1], k.shape[:-2] + q.shape[-2:-1])  # (..., n_q)
    visible = np.ones((*shape, n_k), dtype=bool) if mask is None else np.broadcast_to(mask, (*shape, n_k))
    natives, seen = prepare(case, q=q, k=k, v=v, visible=np.ascontiguousarray(visible))
    out_shape = (*np.broadcast_shapes(shape[:-1], v.shape[:-2]), q.shape[-2], v.shape[-1])
    blocks = []
    for a, b in zip(edges[:-1], edges[1:]):
        part = [case.native(x[..., a:b, :]) for x in (seen["k"], seen["v"])]
        block_mask = case.native(np.ascontiguousarray(visible[..., a:b]))
        blocks.append(_pair(case, _SPLIT.block, [natives["q"], *part, block_mask], out_shape, out_shape[:-1]))
    # the states go to the merge in the call's dtype (a float32 lse of a half-precision call rounded to it: within
    # the block's bound, whose storage rounding is at the call's precision)
    outs = case.native(np.stack([o for o, _ in blocks]))
    lses = case.native(np.stack([lse for _, lse in blocks]))
    got = _pair(case, _SPLIT.merge, [outs, lses], out_shape, out_shape[:-1])
    whole = {"q": seen["q"], "k": seen["k"], "v": seen["v"], "mask": visible}
    with timed("oracle"):
        expected = _SPLIT.block_oracle(whole)
    bounds = lambda p: _SPLIT.split_budget(whole, edges, p)  # noqa: E731
    where = f"the blocks cut at {list(edges)} merged"
    _judge(case, _SPLIT.merge, got, expected, bounds, whole, where)


@check("scaled_dot_product_attention", direction=SPLIT)
def paged_attention(
    case: Case, q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray, block_table: np.ndarray, lengths: np.ndarray
) -> None:
    """Eq. (1) over a paged cache (pages in any physical order, read through the block table) against the oracle's
    Eq. (1) over the contiguous cache, within its bound; the slots no sentence owns hold poison (NaN or +-1e4),
    which must reach nothing."""
    provided(case.impl, PAGED)
    natives, seen = prepare(case, q=q, k_pages=k_pages, v_pages=v_pages, block_table=block_table, lengths=lengths)
    order = ("q", "k_pages", "v_pages", "block_table", "lengths")
    got = case.run(_SPLIT.paged, [natives[n] for n in order])
    with timed("oracle"):
        expected = _SPLIT.paged_oracle(seen)
    a = {**seen, "lse": None}

    def bounds(p: Any) -> tuple[np.ndarray, np.ndarray]:
        return _SPLIT.paged_budget(seen, p), np.zeros(0)

    out_b = _thresholds(bounds, case.arithmetic, (expected, np.zeros(0)))[0]

    def budget_at(dtype: str) -> np.ndarray:
        return _thresholds(bounds, dtype, (expected, np.zeros(0)))[0]

    case.diagnosis = SplitDiagnosis("paged", "out", a, expected, budget_at)
    what = "Eq. (1) over the paged cache: its out disagrees with the oracle over the contiguous cache"
    compare(case, got, expected, out_b, what=what, budget_name=_SPLIT.budget_name)
    case.diagnosis = None
