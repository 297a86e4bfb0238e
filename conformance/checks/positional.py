"""Checks for §3.5: the sinusoidal positional encoding, its shift property and its range."""

from __future__ import annotations

import numpy as np

from aiayn.conformance.checks._common import agreement, agreement_check
from aiayn.conformance.numerics import gamma, precision
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check

positional_encoding = agreement_check("positional_encoding")


@check(
    "positional_encoding",
    kind="property",
    violates=(
        "PE(pos + k) = M_k PE(pos), M_k rotating each interleaved (sin, cos) pair by k / 10000^(2i/d_model) (§3.5)"
    ),
)
def positional_encoding_shift_is_a_linear_map(case: Case, length: int, d_model: int, offset: int) -> None:
    """PE(pos + k) = M_k PE(pos) for a fixed matrix M_k.

    §3.5: "PE_{pos+k} can be represented as a linear function of PE_pos".
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
    compare(
        case,
        shifted,
        got[offset:],
        bound,
        what=f"PE(pos + {offset}) is not M_{offset} PE(pos)",
        expected_name="PE(pos + k)",
    )


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
