"""Checks of the plug-in contract itself (implementations/protocol.py): declarations and the array boundary.

Every other check trusts ``from_numpy``/``to_numpy``: the oracle is run on what ``to_numpy``
returns of ``from_numpy``'s result. These checks make sure that boundary is what the contract says:
rounding to nearest (ties to even) into the dtype, exact widening back, copies not views (both ways).
"""

from __future__ import annotations

import numpy as np

from aiayn.conformance.numerics import precision, round_to
from aiayn.conformance.run.boundary import Remote, from_numpy_then_fill
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.declarations import declaration_problems, known_tests
from aiayn.conformance.run.harness import Case, check
from aiayn.implementations.protocol import contract_problems


@check("contract", kind="contract")
def declarations_follow_the_contract(case: Case) -> None:
    """name, version, device, dtypes, policies and provides() hold valid values; scope, declared_inconclusive and
    known_deviations name what exists (every known deviation a test of this suite)."""
    problems = contract_problems(case.impl) + declaration_problems(case.impl, known_tests())
    case.exact_checks()
    if problems:
        case.fail("declarations break the contract: " + "; ".join(problems))


@check("contract", kind="contract")
def from_numpy_rounds_to_nearest_even(case: Case, x: np.ndarray) -> None:
    """from_numpy(x, dtype) holds x rounded to nearest, ties to even (what NumPy's astype does for float32/float16).

    The expected values come from ``aiayn.conformance.numerics.round_to`` (exact power-of-two scaling and
    ``np.rint``), an independent rounding that also covers bfloat16. Zero tolerance: rounding is exact.
    """
    native = case.native(x)
    seen = case.numpy(native, "from_numpy(x)")
    if seen.shape != x.shape:
        case.fail(f"to_numpy(from_numpy(x)) has shape {seen.shape}, expected {x.shape}")
    correct = round_to(x, case.dtype)
    with np.errstate(invalid="ignore"):  # values beyond float32's range become infinities there, as in such a cast
        twice = round_to(round_to(x, "float32"), case.dtype)  # a cast from float64 through float32 (PyTorch's)
    rounded_twice = (
        precision(case.dtype).p < precision("float32").p
        and not np.array_equal(seen, correct, equal_nan=True)
        and np.array_equal(seen, twice, equal_nan=True)
    )
    compare(
        case,
        seen,
        correct,
        np.zeros(x.shape),
        what=f"from_numpy does not round to the nearest {case.dtype} (ties to even)"
        + (f"; it rounds twice: its values are x rounded to float32, then to {case.dtype}" if rounded_twice else ""),
        expected_name="correct rounding",
    )


@check("contract", kind="contract")
def from_numpy_rounds_random_values(case: Case, x: np.ndarray) -> None:
    """from_numpy rounds drawn values to nearest, ties to even: the same check on random inputs."""
    from_numpy_rounds_to_nearest_even.__wrapped__(case, x)


@check("contract", kind="contract")
def to_numpy_returns_float64_copies_and_round_trips_ids_and_masks(case: Case, x: np.ndarray) -> None:
    """to_numpy returns a float64 copy: writing into it does not change the native array; ids and masks round-trip."""
    native = case.native(x)
    first = case.numpy(native, "x")
    if first.dtype != np.float64:
        case.fail(f"to_numpy returned {first.dtype} for a {case.dtype} array; expected float64")
    if first.flags.writeable:  # a read-only result cannot be a writable view of the native array's memory
        first[...] = -7.0
    second = case.numpy(native, "x")
    compare(
        case,
        second,
        round_to(x, case.dtype),
        np.zeros(x.shape),
        what="to_numpy returned a view: writing into its result changed the native array",
        expected_name="the original values",
    )
    ids = np.arange(-3, x.size - 3, dtype=np.int64).reshape(x.shape)
    back = case.numpy(case.native(ids), "ids")
    if back.dtype != np.int64 or not np.array_equal(back, ids):
        case.fail(f"int64 ids do not round-trip: got {back.dtype} {back.tolist()}, expected {ids.tolist()}")
    mask = (ids % 2) == 0
    back = case.numpy(case.native(mask), "mask")
    if back.dtype != np.bool_ or not np.array_equal(back, mask):
        case.fail(f"bool masks do not round-trip: got {back.dtype} {back.tolist()}, expected {mask.tolist()}")


@check("contract", kind="contract")
def from_numpy_copies_its_input(case: Case, x: np.ndarray) -> None:
    """from_numpy's result owns its values: writing into the NumPy array afterwards changes nothing the
    implementation holds (a tensor that shares the array's memory, at once or lazily, would compute on the edit)."""
    source = np.array(x, dtype=np.float64)  # writable, ours
    if isinstance(case.impl, Remote):  # the array it was handed is its own process's copy: the edit is made there
        what = f"from_numpy(<float64 {x.shape}>, {case.dtype!r}), then the array edited"
        native = case.guard(what, from_numpy_then_fill, case.impl, source, case.dtype, -7.0)
    else:
        native = case.native(source)
        source[...] = -7.0  # the edit: every element, after from_numpy returned
    seen = case.numpy(native, "from_numpy(x), x edited afterwards")
    compare(
        case,
        seen,
        round_to(x, case.dtype),
        np.zeros(x.shape),
        what="from_numpy shares the input's memory: an edit of the NumPy array after from_numpy changed the native "
        "array (the contract's from_numpy returns a copy)",
        expected_name="the values at the time of from_numpy",
    )
