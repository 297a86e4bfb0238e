"""The exact tier's one rounding to float64 (reference/_exact.py) is correct, subnormals included.

Independent oracle: CPython's ``float(fractions.Fraction)`` divides integers with correct rounding
(round half to even) over the whole binary64 range, subnormals included. An mpf is man * 2^exp, so
it converts to a Fraction exactly, and the two roundings can be compared bit for bit. The working
precision ``dps`` every exact-tier function takes is checked before any arithmetic.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.reference._exact import MIN_DPS, check_dps, round_to_float64, to_mp
from aiayn.reference.attention import softmax_exact
from aiayn.reference.positional import positional_encoding_exact


def _fraction(v: mpmath.mpf) -> Fraction:
    """The exact rational value of a finite mpf."""
    sign, man, exp, _ = v._mpf_
    value = Fraction(man) * (Fraction(2) ** exp)
    return -value if sign else value


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def test_double_rounding_trap_in_the_subnormal_range_is_avoided():
    """A value just above the midpoint of two subnormals must round up.

    k = 2^40 (even) puts the subnormal pair k, k+1 (units of 2^-1074) where 53-bit rounding has a
    grid of 2^-1086: the value (k + 1/2 + 2^-126) * 2^-1074 first rounds to the exact midpoint,
    and the second rounding (ties to even) then picks k: the wrong neighbour. One rounding gives k+1.
    """
    k = 2**40
    with mpmath.workprec(400):
        v = (mpmath.mpf(k) + mpmath.mpf(0.5) + mpmath.mpf(2) ** -126) * mpmath.mpf(2) ** -1074
    expected = (k + 1) * 2.0**-1074
    naive = float(v)  # what mpmath's own conversion gives: rounds twice
    got = round_to_float64(v)
    assert got == expected, (
        f"round_to_float64 gave {got!r} (bits {_bits(got)}), expected {expected!r} (bits {_bits(expected)})"
    )
    assert naive != expected, "the trap no longer triggers double rounding in float(mpf); the test needs a new witness"


@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: _bits(x) != _bits(-0.0)))
def test_every_float64_survives_the_round_trip_exactly(x):
    """to_mp is exact and round_to_float64 is the identity on values that are already binary64."""
    got = round_to_float64(to_mp(x)[()])
    assert _bits(got) == _bits(x), f"round trip changed {x!r} to {got!r}"


def test_negative_zero_becomes_positive_zero():
    """mpmath has no signed zero, so the exact tier's zeros are +0.0 (a documented limitation)."""
    assert _bits(round_to_float64(to_mp(-0.0)[()])) == 0


@given(
    man=st.integers(min_value=1, max_value=2**120),
    exp=st.integers(min_value=-1250, max_value=1000),
    negative=st.booleans(),
)
def test_rounding_matches_the_correctly_rounded_fraction(man, exp, negative):
    """Random 120-bit values over the whole range, subnormals and overflow included, vs Fraction."""
    with mpmath.workprec(200):
        v = mpmath.mpf(man) * mpmath.mpf(2) ** exp
        if negative:
            v = -v
    try:
        expected = float(_fraction(v))
    except OverflowError:
        expected = -math.inf if negative else math.inf
    got = round_to_float64(v)
    assert _bits(got) == _bits(expected), (
        f"mpf {v} (man={man}, exp={exp}): got {got!r}, correctly rounded is {expected!r}"
    )


def test_ties_go_to_even_at_a_normal_midpoint():
    """1 + 2^-53 lies halfway between 1 and 1 + 2^-52: ties to even gives 1."""
    with mpmath.workprec(200):
        assert round_to_float64(mpmath.mpf(1) + mpmath.mpf(2) ** -53) == 1.0
        assert round_to_float64(mpmath.mpf(1) + 3 * mpmath.mpf(2) ** -53) == 1.0 + 2.0**-51


def test_non_finite_values_pass_through():
    assert math.isnan(round_to_float64(mpmath.nan))
    assert round_to_float64(mpmath.inf) == math.inf
    assert round_to_float64(mpmath.ninf) == -math.inf
    assert _bits(round_to_float64(mpmath.mpf(0))) == 0


@pytest.mark.parametrize(
    ("dps", "error", "words"),
    [
        ("x", TypeError, r"^dps: expected an int >= 15 \(decimal digits\), got 'x' \(str\)$"),
        (True, TypeError, r"^dps: expected an int >= 15 .*got True \(bool\)$"),
        (20.0, TypeError, r"^dps: expected an int >= 15 .*got 20\.0 \(float\)$"),
        (None, TypeError, r"^dps: expected an int >= 15 .*got None \(NoneType\)$"),
        (14, ValueError, r"^dps: expected at least 15 decimal digits .*got 14$"),
    ],
)
def test_a_bad_dps_is_named_in_every_exact_function(dps, error, words):
    """``dps`` must be an int >= MIN_DPS; anything else raises an error naming ``dps``, not one from
    inside the arithmetic, whether it reaches ``correctly_rounded`` directly (softmax_exact) or is
    first added to guard digits (positional_encoding_exact)."""
    for call in (
        lambda: check_dps(dps),
        lambda: softmax_exact([1.0, 2.0], dps=dps),
        lambda: positional_encoding_exact(3, 4, dps=dps),
    ):
        with pytest.raises(error, match=words):
            call()


def test_an_integer_dps_of_any_integer_type_is_accepted():
    assert MIN_DPS == 15 and check_dps(np.int64(20)) == 20 and type(check_dps(np.int64(20))) is int
    x = [0.5, -1.25, 3.0]
    assert np.array_equal(softmax_exact(x, dps=np.int64(MIN_DPS)), softmax_exact(x))
