"""Checks for §3.5: the sinusoidal positional encoding, its shift property (a linear map exists; §3.5's own map, the
layout's), and its range."""

from __future__ import annotations

import numpy as np

from aiayn.conformance.checks._common import agreement, agreement_check
from aiayn.conformance.numerics import gamma, precision
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check

positional_encoding = agreement_check("positional_encoding")


#: Why the shift property of a table with no more rows than columns is not checked: k rows later are a linear
#: function of any d_model independent rows, whatever the table.
FEW_ROWS = "no more positions than columns: every table has such a map there"
#: Why it is not checked where the rows are too close to dependent for float64 to find the map's residual.
DEPENDENT_ROWS = "the table's rows too close to dependent for float64 to bound the map's residual"


@check(
    "positional_encoding",
    kind="property",
    violates="PE(pos + k) is a linear function of PE(pos) (§3.5): one map T_k takes every row to the row k later",
)
def positional_encoding_shift_is_a_linear_map(case: Case, length: int, d_model: int, offset: int) -> None:
    """Some linear map T takes PE(pos) to PE(pos + k) for every pos, whatever the table's layout (§3.5 states that
    such a map exists; which one is the layout's, checked by :func:`positional_encoding_pairs_rotate_by_k`).

    A = PE_hat[0:n], B = PE_hat[k:n+k] (n = ``length`` > d_model rows). The least-squares residual
    r = min_T ||A T - B||_F = ||B - Q Q^T B||_F, Q an orthonormal basis of A's columns. For a table of sinusoids
    (any layout, spacing or start) the exact map is orthogonal (a rotation of each sin/cos pair, ||T||_2 = 1), so
    the implementation's errors E (|E| <= its budget elementwise) leave r <= ||E_A||_F + ||E_B||_F <=
    ||budget_A||_F + ||budget_B||_F. Float64 rounding of the residual: Householder QR is the exact QR of A + dA,
    ||dA||_F <= gamma_{6 n d}(u) ||A||_F [H, Thm 19.4]; the subspace it spans moves by an angle of at most
    ||dA|| / (sigma_min(A) - 2 ||dA||) (Wedin; the computed sigma_min is within ||dA|| too, the SVD being backward
    stable), moving r by at most that times ||B||_F; the projection B - Q (Q^T B) rounds by gamma_{2n+2}(u) 2
    ||B||_F. Where sigma_min is not above 2 ||dA|| the residual is not bounded: not checked.
    """
    got, _, budget = agreement(case, length=length + offset, d_model=d_model)
    a, b = got[:length], got[offset:]
    if length <= d_model:
        case.tally(unchecked={FEW_ROWS: 1})
        return
    u64 = 2.0**-53
    d_a = float(gamma(6 * length * d_model, u64)) * float(np.linalg.norm(a))
    sigma_min = float(np.linalg.svd(a, compute_uv=False)[-1]) - d_a
    if not sigma_min > 2 * d_a:
        case.tally(unchecked={DEPENDENT_ROWS: 1})
        return
    q, _ = np.linalg.qr(a)  # (n, d_model), orthonormal
    residual = float(np.linalg.norm(b - q @ (q.T @ b)))
    norm_b = float(np.linalg.norm(b))
    rounding = d_a / (sigma_min - 2 * d_a) * norm_b + 2 * float(gamma(2 * length + 2, u64)) * norm_b
    bound = float(np.linalg.norm(budget[:length]) + np.linalg.norm(budget[offset:])) + rounding
    compare(
        case,
        np.array(residual),
        np.array(0.0),
        np.array(bound),
        what=f"no linear map takes PE(pos) to PE(pos + {offset}): the best one leaves ||residual||_F = {residual:.3g}",
        expected_name="a linear map's residual",
    )


@check(
    "positional_encoding",
    kind="property",
    violates=(
        "§3.5's layout: PE(pos + k) = M_k PE(pos), M_k rotating each interleaved (sin, cos) pair by "
        "k / 10000^(2i/d_model)"
    ),
)
def positional_encoding_pairs_rotate_by_k(case: Case, length: int, d_model: int, offset: int) -> None:
    """PE(pos + k) = M_k PE(pos) for §3.5's own M_k: the layout (sin at 2i, cos at 2i + 1) and the frequencies
    10000^(-2i/d_model), not only the existence of a linear map.

    M_k (block-diagonal 2x2 rotations) comes from the oracle. Bound: |M_k PE_hat(pos) - PE_hat(pos + k)|
    <= |M_k| budget(pos) + budget(pos + k) + |dM_k| |PE| + gamma_2(2^-53) |M_k| |PE_hat|, where the
    oracle's M_k is within 2^-53 |M_k| (+ its longdouble error) of the exact rotation, and our own
    float64 product has two terms per output (gamma_2).
    """
    from aiayn.reference.positional import pe_shift_matrix

    got, _, budget = agreement(case, length=length + offset, d_model=d_model)
    m = pe_shift_matrix(offset, d_model)  # (d_model, d_model)
    shifted = got[:length] @ m.T  # row pos -> M_k PE(pos)
    u64 = 2.0**-53
    bound = (
        budget[:length] @ np.abs(m).T
        + budget[offset:]
        + (2 * u64 + float(gamma(2, u64))) * (np.abs(got[:length]) @ np.abs(m).T)
    )
    with np.errstate(invalid="ignore"):
        broken = not np.all(np.abs(shifted - got[offset:]) <= bound)
    compare(
        case,
        shifted,
        got[offset:],
        bound,
        what=f"PE(pos + {offset}) is not §3.5's M_{offset} PE(pos) (each interleaved pair rotated)"
        + (_table_named(case, got) if broken else ""),
        expected_name="PE(pos + k)",
    )


def _table_named(case: Case, got: np.ndarray) -> str:
    """What the table itself matches in the catalogue (its layout, spacing, start): the positional row's own
    diagnosis, on the table this check read."""
    names = [] if case.diagnosis is None else case.diagnosis.explain(got, case.dtype)
    return f"; the table matches {', '.join(repr(n) for n in names)}" if names else ""


@check("positional_encoding", kind="property", violates="every sinusoid lies in [-1, 1] (§3.5)")
def positional_encoding_is_bounded_by_one(case: Case, length: int, d_model: int) -> None:
    """|PE| <= 1 (sines and cosines), up to the allowed error of sin/cos (t relative, see
    aiayn.conformance.numerics)."""
    got = case.run("positional_encoding", [length, d_model, case.dtype])
    limit = 1.0 + precision(case.dtype).t
    clipped = np.clip(got, -limit, limit)
    compare(
        case,
        got,
        clipped,
        np.full(got.shape, precision(case.arithmetic).eta),
        what=f"|PE| exceeds 1 (+ sin/cos's allowed error, limit {limit!r})",
        expected_name="the limit",
    )
