"""One record per equation of the paper: everything the suite knows about it, in one place.

Each :class:`Equation` holds what the rest of the suite reads about one equation: its name (the
oracle's and the implementation's method name, ``implementations/protocol.py`` ``EQUATIONS``) and
section title; the implementation method's argument order; the oracle and how the declared
policies become its arguments; the budget and how the oracle's own share enters it; the diagnoses
model and the catalogue families that concern it (``diagnoses/forward.py``); whether it is checked in the
first dtype only; the largest fraction of elements that may go unchecked (``report/coverage.py``); and the
default strategy that draws its inputs (``inputs/strategies.py``). :func:`aiayn.conformance.checks._common.agreement`
is the one recipe that turns a record into a check (prepare the inputs, call the implementation,
run the oracle, form the budget, set what the diagnoses need).

A pass of another kind over the same equation (its backward pass, a decode step) is a further
field of the same record: an oracle, a budget and a call hook of its own, read by the same recipe.

No other module keeps a table keyed by equation names (``tests/meta/test_equation_records.py``
checks it); the README's traceability table is generated from these records (``report/traceability.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from aiayn.conformance.budgets import backward as BB
from aiayn.conformance.budgets import forward as B
from aiayn.conformance.budgets import split as SB
from aiayn.conformance.budgets.composites import backward as BP
from aiayn.conformance.budgets.composites import forward as PR
from aiayn.conformance.diagnoses import forward as D
from aiayn.conformance.directions import BACKWARD, BEAM_SEARCH, CACHED_STEPS, DECODE
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.batches import Batching
from aiayn.conformance.numerics import floored, precision
from aiayn.reference import attention as ref_attention
from aiayn.reference import decoding as ref_decoding
from aiayn.reference import layers as ref_layers
from aiayn.reference import model as ref_model
from aiayn.reference import positional as ref_positional
from aiayn.reference import training as ref_training

__all__ = [
    "BACKWARD",
    "CONTRACT",
    "DECODE",
    "Backward",
    "Decode",
    "Equation",
    "Split",
    "RECORDS",
    "record",
    "smoothing",
    "title",
]


#: The report's row for the plug-in contract itself (not an equation of the paper).
CONTRACT = "contract"
_CONTRACT_TITLE = "the plug-in contract (implementations/protocol.py)"

#: The oracle's share of a budget: "added" (the equation's bound at the dtype plus the same bound at
#: float64, the oracle's own arithmetic) or "propagated" (one first-order bound given both
#: precisions, ``budgets/composites/forward.py``); either way floored at one ulp (``numerics.floored``).
ADDED, PROPAGATED = "added", "propagated"

Args = Mapping[str, Any]

#: The implementation's declared policies, as the records' hooks read them: ``declared[key]`` is the declared value,
#: validated (an absent or invalid one fails the check that reads it, ``checks/_common.declared``), and
#: ``declared.get(key, default)`` an optional one.
Declared = Mapping[str, Any]

#: The largest fraction of drawn elements that may go unchecked, unless an equation's record states another.
DEFAULT_MAX_UNCHECKED = 0.01


def _no_policies(declared: Declared) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Backward:
    """What the suite knows about an equation's backward pass: its VJP for a cotangent of the result.

    ``gradients``: the arguments differentiated, by name (the oracle's names; an implementation's gradients are
    read under the same names, ``conformance/run/gradients.py``; ``names(a)`` where they depend on the arguments: a
    composite's parameter paths). ``oracle(a, d_out)``: the exact VJP (the fast tier) by name, ``a`` being the
    forward record's oracle arguments; ``budget(a, d_out, p)``: a bound per gradient at precision ``p``
    (``conformance/budgets/backward.py``); the oracle's share is the same bound at float64, added, or with
    ``oracle_share`` "propagated" one first-order bound given both precisions
    (``conformance/budgets/composites/backward.py``).
    """

    gradients: tuple[str, ...]
    oracle: Callable[[Args, np.ndarray], Mapping[str, np.ndarray]]
    budget: Callable[[Args, np.ndarray, Any], Mapping[str, np.ndarray]]
    budget_name: str
    oracle_share: str = ADDED
    names: Callable[[Args], tuple[str, ...]] | None = None

    def gradient_names(self, a: Args) -> tuple[str, ...]:
        """The gradients of this call: ``gradients``, or where they depend on the arguments (a composite's parameter
        paths: "encoder.0.self_attn.w_q", ...) ``names(a)``."""
        return self.gradients if self.names is None else self.names(a)

    def budget_at(self, a: Args, d_out: np.ndarray, expected: Mapping[str, np.ndarray], dtype: str) -> dict:
        """Each gradient's comparison threshold in ``dtype``: the bound at the dtype plus the bound at float64 (the
        oracle's; "propagated": one first-order bound given both precisions), floored at 1 ulp of the dtype at the
        expected value."""
        if self.oracle_share == PROPAGATED:
            both = self.budget(a, d_out, [precision(dtype), precision("float64")])
            here, ours = both, {name: 0.0 for name in both}
        else:
            here, ours = self.budget(a, d_out, precision(dtype)), self.budget(a, d_out, precision("float64"))
        return {
            name: floored(np.asarray(here[name], dtype=np.float64) + np.asarray(ours[name]), dtype, expected[name])
            for name in self.gradient_names(a)
            if name in here  # an absent parameter (an MHA bias not given) has no gradient to bound
        }


@dataclass(frozen=True)
class Decode:
    """What the suite knows about decoding with an equation (the whole model's: §3.2.3, §6.1).

    ``steps``: the implementation's methods of cached decoding, ``search``: of beam search
    (``implementations/protocol.py``, "Decoding"; absent ones: "not provided"). The cached step's oracle and budget are
    the record's own forward ones restricted to the step's positions (``aiayn.reference.decoding.step_logits``: the
    decoder is causal); the search's oracle is ``search_oracle`` (over a scorer of prefixes, with the declared
    policies) and its length penalty ``length_penalty``, its budget ``budgets/decoding.py`` built on the same forward
    budget (``checks/decoding.py``). ``agreement``: the decoding checks that compare with the oracle directly (what
    ``--aiayn-agreement-only`` keeps of decoding). ``steps_batch``, ``search_batch``: what one batch element of cached
    decoding and of beam search is (``inputs/batches.py``), read by their batch-invariance checks.
    """

    steps: tuple[str, ...]
    search: tuple[str, ...]
    budget_name: str
    search_oracle: Callable[..., Any]
    length_penalty: Callable[[int, float], float]
    agreement: tuple[str, ...]
    steps_batch: Batching
    search_batch: Batching


@dataclass(frozen=True)
class Split:
    """What the suite knows about computing an equation over blocks of its keys and merging them (split keys, §3.2.1;
    the identity proven in ``aiayn.reference.attention``, "split keys").

    ``block``, ``merge``: the implementation's methods (``implementations/protocol.py``, "Split keys"; absent: "not
    provided"): Eq. (1) over one block with its log-sum-exp, and the merge of blocks' (output, log-sum-exp) states.
    ``block_oracle(a)`` and ``merge_oracle(outs, lses)`` give (output, log-sum-exp); ``block_budget(a, p)``,
    ``merge_budget(outs, lses, p)`` and ``split_budget(a, edges, p)`` bound both at precision ``p``
    (``budgets/split.py``: one block, one merge, blocks merged), the oracle's share added at float64. ``paged``: the
    method of Eq. (1) over a paged cache (its own option), ``paged_oracle(a)`` and ``paged_budget(a, p)`` its oracle
    and bound.
    """

    block: str
    merge: str
    block_oracle: Callable[[Args], tuple[np.ndarray, np.ndarray]]
    merge_oracle: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    block_budget: Callable[[Args, Any], tuple[np.ndarray, np.ndarray]]
    merge_budget: Callable[[np.ndarray, np.ndarray, Any], tuple[np.ndarray, np.ndarray]]
    split_budget: Callable[[Args, Any, Any], tuple[np.ndarray, np.ndarray]]
    budget_name: str
    paged: str
    paged_oracle: Callable[[Args], np.ndarray]
    paged_budget: Callable[[Args, Any], np.ndarray]

    @property
    def methods(self) -> tuple[str, str]:
        """The implementation's methods of split keys, in the order the checks call them."""
        return (self.block, self.merge)


@dataclass(frozen=True)
class Equation:
    """What the suite knows about one equation of the paper.

    ``arguments``: the implementation method's arguments, in order (the method has the equation's
    name); ``passes_dtype``: the method also takes the case's dtype as its last argument (PE builds
    its table in it). ``policies(case)``: the oracle's arguments that come from the declared
    policies; ``oracle(a)``: the expected value, ``a`` being the arguments as the implementation saw
    them plus those policies. ``budget(a, expected, p)``: the bound at precision ``p`` (a list of
    two precisions, the dtype's and float64's, where ``oracle_share`` is "propagated").
    ``backward``: the equation's backward pass, where it has one (:class:`Backward`); ``decode``: decoding with it,
    where it is the whole model (:class:`Decode`); ``differentiable``: False
    where the equation takes no float input (positional encoding, lrate, label smoothing): no backward to have.
    ``model``: the diagnoses' model of the equation (``diagnoses/forward.py``), called with the arguments
    plus ``model_policies(case)``; ``diagnosis_policies``: the values the diagnoses' budget takes
    instead of the declared ones (the widest fully-masked policy, so that every variant is judged
    by one bound). ``departures``: the catalogue families that concern it. ``call``: how to call
    the implementation, where a plain ``case.run`` does not do (lrate returns Python floats; Adam, dropout and the
    averaged checkpoints several arrays; dropout's call adds the mask it drew to the arguments, as ``keep``).
    """

    name: str
    title: str
    short: str
    arguments: tuple[str, ...]
    oracle: Callable[[Args], Any]
    budget: Callable[[Args, np.ndarray, Any], Any]
    budget_name: str
    model: Callable[..., np.ndarray]
    departures: frozenset[str]
    strategy: Callable[..., Any]
    oracle_share: str = ADDED
    passes_dtype: bool = False
    policies: Callable[[Declared], dict[str, Any]] = _no_policies
    model_policies: Callable[[Declared], dict[str, Any]] | None = None
    diagnosis_policies: Mapping[str, Any] = field(default_factory=dict)
    call: Callable[[Any, Mapping[str, Any], Args], np.ndarray] | None = None
    first_dtype_only: bool = False
    max_unchecked: float = DEFAULT_MAX_UNCHECKED
    backward: Backward | None = None
    decode: Decode | None = None
    differentiable: bool = True  # False: no float input to differentiate (sizes, steps, integer targets)
    no_backward: str = "no float input"  # why, where ``differentiable`` is False
    # (mask broadcastable to the result, why) for the elements of a result no caller defines (the logits at padded
    # target positions): not compared, counted as not checked; from the raw arguments; None: every element compared
    undefined: Callable[[Args], tuple[np.ndarray, str] | None] | None = None
    # what one batch element is, for the batch-invariance check (``checks/invariance.py``); None: not batched
    batch: Batching | None = None
    # the equation over blocks of its keys, merged (``checks/split.py``); None: it has no keys to split
    split: Split | None = None
    # the oracle's function and how it is called, where not ``aiayn.reference``'s function of the record's name (a
    # layer in training mode is the evaluation layer's oracle given the masks): "function (arguments)"
    oracle_name: str = ""

    def model_arguments(self, declared: Declared, seen: Mapping[str, Any]) -> dict[str, Any]:
        """The diagnoses' arguments of :attr:`model` (``diagnoses.forward.evaluate``): the arguments as the
        implementation saw them plus the policies the model takes (``model_policies``, else ``policies``), declared by
        ``case``'s implementation. The one way every diagnosis builds them."""
        return {**seen, **(self.model_policies or self.policies)(declared)}

    def budget_at(self, a: Args, expected: np.ndarray, dtype: str) -> np.ndarray:
        """The comparison threshold in ``dtype`` (or "<dtype>-ftz"), the oracle's share included, floored at 1 ulp."""
        if self.oracle_share == PROPAGATED:
            derived = self.budget(a, expected, [precision(dtype), precision("float64")])
        else:
            derived = np.asarray(self.budget(a, expected, precision(dtype)), dtype=np.float64) + np.asarray(
                self.budget(a, expected, precision("float64")), dtype=np.float64
            )
        return floored(derived, dtype, expected)


# --------------------------------------------------------------------------------------------
# how declared policies become arguments


#: Why the logits at a padded target position are not compared: a query there sees only the keys before the padding
#: (the oracle computes a number), but no decoder defines that position (an incremental one never feeds it) and no
#: loss or search reads it.
PADDED_TARGET = "a padded target position: no decoder defines its logits, nothing reads them"

#: Reasons of elements no caller defines (a record's ``undefined``): shown as not checked, but outside the stated
#: largest unchecked fraction (``report/coverage.py``), which concerns elements the suite could not judge.
UNDEFINED_REASONS = frozenset({PADDED_TARGET})


def unjudged(reasons: Mapping[str, int]) -> dict[str, int]:
    """Of the not-checked elements by reason, those the suite could not judge: every reason but the
    :data:`UNDEFINED_REASONS` (elements no caller defines)."""
    return {why: n for why, n in reasons.items() if why not in UNDEFINED_REASONS}


def _padded_targets(a: Args) -> tuple[np.ndarray, str] | None:
    """(B, n_tgt, 1): True at the target positions at or after each sentence's ``tgt_lengths``."""
    if a.get("tgt_lengths") is None:
        return None
    n_tgt = np.shape(a["tgt"])[-1]
    return (np.arange(n_tgt)[None, :] >= np.asarray(a["tgt_lengths"])[:, None])[:, :, None], PADDED_TARGET


def _fully_masked(declared: Declared) -> dict[str, Any]:
    return {"fully_masked": declared["fully_masked"]}


def _eps(declared: Declared) -> dict[str, Any]:
    return {"eps": float(declared["layer_norm_eps"])}


def _layers_model(declared: Declared) -> dict[str, Any]:
    return {**_eps(declared), **_fully_masked(declared)}


def _padding_id(declared: Declared) -> int:
    return int(declared.get("padding_id", 0))


def smoothing(declared: Declared) -> dict[str, Any]:
    """The oracle's label-smoothing arguments for the declared policy: "K" and "K-1" as they are; "K-2" is the
    oracle's "K-1" with a padding class (``policies.get("padding_id", 0)``) that takes no mass, so eps is spread
    over the other K - 2 classes."""
    variant = declared["label_smoothing"]
    if variant == "K-2":
        return {"variant": "K-1", "padding_id": _padding_id(declared)}
    return {"variant": variant, "padding_id": None}


def _smoothing_model(declared: Declared) -> dict[str, Any]:
    return {"declared": declared["label_smoothing"], "padding_id": _padding_id(declared)}


def _step_zero(declared: Declared) -> dict[str, Any]:
    return {"step_zero": declared["step_zero"]}


def lrate_value(case: Any, step: int, d_model: int, warmup_steps: int) -> float:
    """One call of the implementation's lrate, twice (determinism), checked to return a Python float (how the lrate
    record calls it; ``case`` is the check's ``run.harness.Case``)."""
    first = case.call("lrate", step, d_model, warmup_steps)
    second = case.call("lrate", step, d_model, warmup_steps)
    for value in (first, second):
        if isinstance(value, bool) or not isinstance(value, float):
            case.fail(
                f"lrate({step}, {d_model}, {warmup_steps}) returned {type(value).__name__} {value!r}; "
                "the contract says a Python float"
            )
    if not (first == second or (math.isnan(first) and math.isnan(second))):
        case.fail(f"lrate({step}, {d_model}, {warmup_steps}) is not deterministic: {first!r} then {second!r}")
    return first


def _lrate_call(case: Any, natives: Mapping[str, Any], a: Args) -> np.ndarray:
    return np.array([lrate_value(case, s, a["d_model"], a["warmup_steps"]) for s in a["steps"]], dtype=np.float64)


#: Adam's arguments, in the contract's order, and its results, in the order it returns them (stacked (3, ...) for the
#: comparison: a failure at index (0, ...) is in the parameter, (1, ...) in m, (2, ...) in v).
ADAM_ARGUMENTS = ("param", "grad", "m", "v", "step", "lr", "betas", "eps")
ADAM_RESULTS = ("param", "m", "v")


def _dropout_call(case: Any, natives: Mapping[str, Any], a: Args) -> np.ndarray:
    """y, the result; the mask the call drew joins the arguments as ``keep`` (a bool array, judged so by the harness):
    the oracle computes y given it."""
    y, keep = case.run("dropout", [natives[n] for n in ("x", "p", "seed")], parts=("y", "keep"), part_dtypes=_BOOL)
    a["keep"] = keep != 0  # type: ignore[index]  (the arguments as seen: the one place a call adds to them)
    return y


_BOOL = MappingProxyType({"keep": "bool"})


def _checkpoint_names(a: Args) -> list[str]:
    """The parameter names of the checkpoints, in the order of the first checkpoint: the order the averaged values are
    compared in (flattened and concatenated)."""
    return list(next(iter(a["checkpoints"].values())))


def _averaging_call(case: Any, natives: Mapping[str, Any], a: Args) -> np.ndarray:
    first = next(iter(a["checkpoints"].values()))
    shapes = {name: np.shape(first[name]) for name in _checkpoint_names(a)}
    return case.run("average_checkpoints", [natives["checkpoints"], natives["n"]], parts=shapes)


def _averaged(a: Args) -> np.ndarray:
    means = ref_training.average_checkpoints(a["checkpoints"], a["n"])
    return np.concatenate([means[name].reshape(-1) for name in _checkpoint_names(a)])


def _averaging_budget(a: Args, p: Any) -> np.ndarray:
    chosen = ref_training.last_checkpoints(a["checkpoints"], a["n"])
    return np.concatenate(
        [
            B.average_checkpoints(np.stack([a["checkpoints"][s][name] for s in chosen]), p).reshape(-1)
            for name in _checkpoint_names(a)
        ]
    )


def _layer_training_call(name: str, arguments: tuple[str, ...], sublayers: tuple[str, ...]) -> Callable[..., Any]:
    """How a layer in training mode is called: its output, and the masks it drew by sub-layer (§5.4), judged as bool
    arrays of the output's shape by the harness, join the arguments as ``keep``: the oracle computes the layer given
    them."""

    def call(case: Any, natives: Mapping[str, Any], a: Args) -> np.ndarray:
        got = case.run(
            name,
            [natives[n] for n in arguments],
            parts=("out", *sublayers),
            part_dtypes=MappingProxyType(dict.fromkeys(sublayers, "bool")),
        )
        a["keep"] = {s: got[i + 1] != 0 for i, s in enumerate(sublayers)}  # type: ignore[index]
        return got[0]

    return call


def _model_training_call(case: Any, natives: Mapping[str, Any], a: Args) -> np.ndarray:
    """The whole model in training mode: a mapping of its logits and its masks by place
    (``reference.model.dropout_places``), each judged by the harness (the masks bool arrays of the shapes they drop);
    the masks join the arguments as ``keep`` and the logits are the result."""
    src, tgt, params = np.shape(a["src"]), np.shape(a["tgt"]), a["params"]
    vocab, d = np.shape(params["embedding"])
    places = ref_model.dropout_places(len(params["encoder"]), len(params["decoder"]))
    shapes = {"logits": (*tgt, vocab)} | {
        place: (*(src if place.startswith(("src", "encoder")) else tgt), d) for place in places
    }
    got = case.run(
        "transformer_forward_training",
        [natives[n] for n in MODEL_TRAINING_ARGUMENTS],
        parts=shapes,
        part_dtypes=MappingProxyType(dict.fromkeys(places, "bool")),
    )
    parts, start = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        parts[name] = got[start : start + size].reshape(shape)
        start += size
    a["keep"] = {place: parts[place] != 0 for place in places}  # type: ignore[index]
    return parts["logits"]


MODEL_TRAINING_ARGUMENTS = ("src", "tgt", "params", "num_heads", "p", "seed", "src_lengths", "tgt_lengths")
ENCODER_TRAINING_ARGUMENTS = ("x", "params", "num_heads", "p", "seed", "mask")
DECODER_TRAINING_ARGUMENTS = ("y", "memory", "params", "num_heads", "p", "seed", "self_mask", "memory_mask")


def _adam(declared: Declared) -> dict[str, Any]:
    """The oracle's choices of Adam from the declared policies (absent: Kingma & Ba's Algorithm 1)."""
    return {
        "bias_correction": declared.get("adam_bias_correction", True),
        "eps_placement": declared.get("adam_eps", "outside"),
    }


def _adam_call(case: Any, natives: Mapping[str, Any], a: Args) -> np.ndarray:
    return case.run("adam_step", [natives[name] for name in ADAM_ARGUMENTS], parts=ADAM_RESULTS)


def _smoothed_targets(a: Args) -> np.ndarray:
    vocab = np.shape(a["logits"])[-1]
    return ref_training.label_smoothing(a["targets"], vocab, a["eps"], variant=a["variant"], padding_id=a["padding_id"])


def _parameter_paths(a: Args) -> tuple[str, ...]:
    """A composite's parameters by dotted path (``reference.model.flatten_params``): "self_attn.w_q",
    "encoder.0.ffn.w1", ... (an absent bias has none: nothing to compare)."""
    return tuple(ref_model.flatten_params(a["params"]))


# --------------------------------------------------------------------------------------------
# what one batch element of each batched equation is (``inputs/batches.py``)


def _softmax_core(a: Args) -> dict[str, int]:
    """softmax's x: the dimensions from the softmax axis on are one element; those before it, the batch."""
    ndim = np.ndim(a["x"])
    return {"x": ndim - a["axis"] % ndim}


_PER_POSITION = "padding is more positions: acts on each position alone, so the batch arrangement is that check"
_ATTENTION_BATCH = Batching(
    core=lambda a: {"q": 2, "k": 2, "v": 2, "mask": 2},
    positions=("q", "k", "v"),
    masks={"mask": ("q", "k")},
    rows="q",
)
_MHA_BATCH = Batching(
    core=lambda a: {"query": 2, "key": 2, "value": 2, "mask": 2},
    positions=("query", "key", "value"),
    masks={"mask": ("query", "key")},
    rows="query",
)
_ROWS_BATCH = Batching(core=lambda a: {"x": 1}, why_no_padding=_PER_POSITION)
_ENCODER_BATCH = Batching(core=lambda a: {"x": 2, "mask": 2}, positions=("x",), masks={"mask": ("x", "x")}, rows="x")
_DECODER_BATCH = Batching(
    core=lambda a: {"y": 2, "memory": 2, "self_mask": 2, "memory_mask": 2},
    positions=("y", "memory"),
    masks={"self_mask": ("y", "y"), "memory_mask": ("y", "memory")},
    causal=frozenset({"self_mask"}),
    rows="y",
)
_MODEL_BATCH = Batching(
    core=lambda a: {"src": 1, "tgt": 1, "src_lengths": 0, "tgt_lengths": 0},
    lengths={"src_lengths": "src", "tgt_lengths": "tgt"},
    positions=("src", "tgt"),
    rows="tgt",
)


# --------------------------------------------------------------------------------------------
# the records, in paper order (EQUATIONS)

_ALL = "arithmetic"  # float32 inside a float64 claim, flushed subnormals: every equation
_LAYER_FAMILIES = frozenset({"attention", "heads", "layer_norm", "ffn", "residual", _ALL})
_UNIFORM = MappingProxyType({"fully_masked": "uniform"})

_RECORDS: tuple[Equation, ...] = (
    Equation(
        name="softmax",
        title="softmax (§3.2.1, inside Eq. (1))",
        short="softmax",
        arguments=("x", "axis"),
        oracle=lambda a: ref_attention.softmax(a["x"], a["axis"]),
        budget=lambda a, e, p: B.softmax(a["x"], a["axis"], p),
        budget_name="shifted-softmax bound, budgets.forward.softmax",
        model=D.softmax,
        departures=frozenset({"softmax", _ALL}),
        strategy=S.softmax_inputs,
        batch=Batching(
            core=_softmax_core,
            axis="axis",
            why_no_padding="softmax has no mask: a hidden entry is an input of -inf, which its agreement check draws",
        ),
        backward=Backward(
            gradients=("x",),
            oracle=lambda a, g: {"x": ref_attention.softmax_vjp(a["x"], g, a["axis"])},
            budget=lambda a, g, p: BB.softmax(a["x"], g, a["axis"], p),
            budget_name="softmax VJP bound, budgets.backward.softmax",
        ),
    ),
    Equation(
        name="scaled_dot_product_attention",
        title="scaled dot-product attention (§3.2.1, Eq. (1))",
        short="Eq. (1)",
        arguments=("q", "k", "v", "mask"),
        policies=_fully_masked,
        oracle=lambda a: ref_attention.scaled_dot_product_attention(
            a["q"], a["k"], a["v"], a["mask"], fully_masked=a["fully_masked"]
        ),
        budget=lambda a, e, p: B.scaled_dot_product_attention(a["q"], a["k"], a["v"], a["mask"], p, a["fully_masked"]),
        budget_name="Eq. (1) bound, budgets.forward.attention_core",
        model=D.scaled_dot_product_attention,
        diagnosis_policies=_UNIFORM,
        departures=frozenset({"attention", _ALL}),
        strategy=S.attention_inputs,
        batch=_ATTENTION_BATCH,
        split=Split(
            block="attention_with_lse",
            merge="merge_attention_states",
            block_oracle=lambda a: ref_attention.attention_with_lse(a["q"], a["k"], a["v"], a["mask"]),
            merge_oracle=ref_attention.merge_attention_states,
            block_budget=lambda a, p: SB.attention_with_lse(a["q"], a["k"], a["v"], a["mask"], p),
            merge_budget=SB.merged,
            split_budget=lambda a, edges, p: SB.split_attention(a["q"], a["k"], a["v"], a["mask"], edges, p),
            budget_name="split-keys bounds, budgets.split",
            paged="paged_attention",
            paged_oracle=lambda a: ref_attention.paged_attention(
                a["q"], a["k_pages"], a["v_pages"], a["block_table"], a["lengths"]
            ),
            paged_budget=lambda a, p: SB.paged_attention(
                a["q"], a["k_pages"], a["v_pages"], a["block_table"], a["lengths"], p
            ),
        ),
        backward=Backward(
            gradients=("q", "k", "v"),
            oracle=lambda a, g: dict(
                zip(
                    ("q", "k", "v"),
                    ref_attention.scaled_dot_product_attention_vjp(
                        a["q"], a["k"], a["v"], g, a["mask"], fully_masked=a["fully_masked"]
                    ),
                )
            ),
            budget=lambda a, g, p: BB.scaled_dot_product_attention(
                a["q"], a["k"], a["v"], a["mask"], g, p, a["fully_masked"]
            ),
            budget_name="Eq. (1) VJP bound, budgets.backward.scaled_dot_product_attention",
        ),
    ),
    Equation(
        name="multi_head_attention",
        title="multi-head attention (§3.2.2)",
        short="multi-head",
        arguments=("query", "key", "value", "params", "num_heads", "mask"),
        policies=_fully_masked,
        oracle=lambda a: ref_attention.multi_head_attention(
            a["query"], a["key"], a["value"], a["params"], a["num_heads"], a["mask"], fully_masked=a["fully_masked"]
        ),
        budget=lambda a, e, p: B.multi_head_attention(
            a["query"], a["key"], a["value"], a["params"], a["num_heads"], a["mask"], p, a["fully_masked"]
        ),
        budget_name="MHA bound, budgets.forward.multi_head_attention",
        model=D.multi_head_attention,
        diagnosis_policies=_UNIFORM,
        departures=frozenset({"attention", "heads", _ALL}),
        strategy=S.mha_inputs,
        batch=_MHA_BATCH,
        backward=Backward(
            gradients=ref_attention.MHA_GRADIENTS,
            oracle=lambda a, g: ref_attention.multi_head_attention_vjp(
                a["query"],
                a["key"],
                a["value"],
                a["params"],
                a["num_heads"],
                g,
                a["mask"],
                fully_masked=a["fully_masked"],
            ),
            budget=lambda a, g, p: BB.multi_head_attention(
                a["query"], a["key"], a["value"], a["params"], a["num_heads"], a["mask"], g, p, a["fully_masked"]
            ),
            budget_name="MHA VJP bound, budgets.backward.multi_head_attention",
        ),
    ),
    Equation(
        name="positional_encoding",
        title="positional encoding (§3.5)",
        short="PE (§3.5)",
        arguments=("length", "d_model"),
        passes_dtype=True,
        differentiable=False,
        oracle=lambda a: ref_positional.positional_encoding(a["length"], a["d_model"]),
        budget=lambda a, e, p: B.positional_encoding(
            a["length"], a["d_model"], p, **({} if a.get("ops") is None else D.pe_table(a["d_model"], a["ops"]))
        ),
        budget_name="PE argument-growth bound, budgets.forward.positional_encoding",
        model=D.positional_encoding,
        departures=frozenset({"positional", _ALL}),
        strategy=S.pe_inputs,
    ),
    Equation(
        name="layer_norm",
        title="LayerNorm (§3.1)",
        short="LayerNorm",
        arguments=("x", "gain", "bias", "eps"),
        oracle=lambda a: ref_layers.layer_norm(a["x"], a["gain"], a["bias"], a["eps"]),
        budget=lambda a, e, p: B.layer_norm(a["x"], a["gain"], a["bias"], a["eps"], p),
        budget_name="LayerNorm bound (two-pass/Welford, Chan-Golub-LeVeque), budgets.forward.layer_norm",
        model=D.layer_norm,
        departures=frozenset({"layer_norm", "layer_norm_rows", _ALL}),
        strategy=S.layer_norm_inputs,
        batch=_ROWS_BATCH,
        backward=Backward(
            gradients=("x", "gain", "bias"),
            oracle=lambda a, g: dict(
                zip(("x", "gain", "bias"), ref_layers.layer_norm_vjp(a["x"], a["gain"], a["bias"], g, a["eps"]))
            ),
            budget=lambda a, g, p: BB.layer_norm(a["x"], a["gain"], a["bias"], a["eps"], g, p),
            budget_name="LayerNorm VJP bound, budgets.backward.layer_norm",
        ),
    ),
    Equation(
        name="feed_forward",
        title="position-wise feed-forward (§3.3, Eq. (2))",
        short="FFN (Eq. 2)",
        arguments=("x", "w1", "b1", "w2", "b2"),
        oracle=lambda a: ref_layers.feed_forward(a["x"], a["w1"], a["b1"], a["w2"], a["b2"]),
        budget=lambda a, e, p: B.feed_forward(a["x"], a["w1"], a["b1"], a["w2"], a["b2"], p),
        budget_name="Eq. (2) bound, budgets.forward.feed_forward",
        model=D.feed_forward,
        departures=frozenset({"ffn", _ALL}),
        strategy=S.ffn_inputs,
        batch=_ROWS_BATCH,
        backward=Backward(
            gradients=("x", "w1", "b1", "w2", "b2"),
            oracle=lambda a, g: dict(
                zip(
                    ("x", "w1", "b1", "w2", "b2"),
                    ref_layers.feed_forward_vjp(a["x"], a["w1"], a["b1"], a["w2"], a["b2"], g),
                )
            ),
            budget=lambda a, g, p: BB.feed_forward(a["x"], a["w1"], a["b1"], a["w2"], a["b2"], g, p),
            budget_name="Eq. (2) VJP bound (either ReLU branch near 0), budgets.backward.feed_forward",
        ),
    ),
    Equation(
        name="lrate",
        title="learning rate schedule (§5.3, Eq. (3))",
        short="lrate (Eq. 3)",
        arguments=("steps", "d_model", "warmup_steps"),
        call=_lrate_call,
        oracle=lambda a: ref_training.lrate(np.array(a["steps"], dtype=np.int64), a["d_model"], a["warmup_steps"]),
        budget=lambda a, e, p: B.lrate(e, p, np.array(a["steps"], dtype=np.float64), a["d_model"]),
        budget_name="budgets.forward.lrate",
        model=D.lrate,
        model_policies=_step_zero,
        departures=frozenset({"lrate", _ALL}),
        strategy=S.lrate_inputs,
        first_dtype_only=True,  # Python numbers in, a Python float out: no dtype to vary
        differentiable=False,
    ),
    Equation(
        name="adam_step",
        title="Adam's step (§5.3; Kingma & Ba, Algorithm 1)",
        short="Adam",
        arguments=ADAM_ARGUMENTS,
        call=_adam_call,
        policies=_adam,
        oracle=lambda a: np.stack(
            ref_training.adam_step(
                *(a[name] for name in ADAM_ARGUMENTS),
                bias_correction=a["bias_correction"],
                eps_placement=a["eps_placement"],
            )
        ),
        budget=lambda a, e, p: B.adam_step(a, p),
        budget_name="budgets.forward.adam_step",
        model=D.adam_step,
        departures=frozenset({"adam", _ALL}),
        strategy=S.adam_inputs,
        differentiable=False,
        no_backward="an update rule: nothing of the paper differentiates it",
    ),
    Equation(
        name="label_smoothing",
        title="label smoothing (§5.4)",
        short="smoothing",
        arguments=("targets", "vocab_size", "eps"),
        policies=smoothing,
        oracle=lambda a: ref_training.label_smoothing(
            a["targets"], a["vocab_size"], a["eps"], variant=a["variant"], padding_id=a["padding_id"]
        ),
        budget=lambda a, e, p: B.label_smoothing(e, p),
        budget_name="budgets.forward.label_smoothing",
        model=D.label_smoothing,
        model_policies=_smoothing_model,
        departures=frozenset({"smoothing", _ALL}),
        strategy=S.label_smoothing_inputs,
        first_dtype_only=True,  # integer targets in, the first (most precise) dtype out
        differentiable=False,
    ),
    Equation(
        name="smoothed_cross_entropy",
        title="smoothed cross-entropy (§5.4)",
        short="cross-entropy",
        arguments=("logits", "targets", "eps"),
        policies=smoothing,
        oracle=lambda a: ref_training.smoothed_cross_entropy(
            a["logits"], a["targets"], a["eps"], variant=a["variant"], padding_id=a["padding_id"]
        ),
        budget=lambda a, e, p: B.smoothed_cross_entropy(a["logits"], _smoothed_targets(a), p),
        budget_name="budgets.forward.smoothed_cross_entropy",
        model=D.smoothed_cross_entropy,
        model_policies=_smoothing_model,
        departures=frozenset({"smoothing", _ALL}),
        strategy=S.cross_entropy_inputs,
        backward=Backward(
            gradients=("logits",),
            oracle=lambda a, g: {
                "logits": ref_training.smoothed_cross_entropy_vjp(
                    a["logits"], a["targets"], a["eps"], g, variant=a["variant"], padding_id=a["padding_id"]
                )
            },
            budget=lambda a, g, p: BB.smoothed_cross_entropy(a["logits"], _smoothed_targets(a), g, p),
            budget_name="cross-entropy VJP bound, budgets.backward.smoothed_cross_entropy",
        ),
    ),
    Equation(
        name="dropout",
        title="residual dropout (§5.4)",
        short="dropout",
        arguments=("x", "p", "seed"),
        call=_dropout_call,
        oracle=lambda a: ref_training.dropout(a["x"], a["keep"], a["p"]),
        budget=lambda a, e, p: B.dropout(e, a["p"], p),
        budget_name="budgets.forward.dropout (given its own mask; the mask itself: budgets.draws)",
        model=D.dropout,
        departures=frozenset({"dropout", _ALL}),
        strategy=S.dropout_inputs,
        differentiable=False,
        no_backward="not yet: its gradient is the same mask and scale",
    ),
    Equation(
        name="average_checkpoints",
        title="checkpoint averaging (§6.1)",
        short="averaging",
        arguments=("checkpoints", "n"),
        call=_averaging_call,
        oracle=_averaged,
        budget=lambda a, e, p: _averaging_budget(a, p),
        budget_name="budgets.forward.average_checkpoints",
        model=D.average_checkpoints,
        departures=frozenset({"averaging", _ALL}),
        strategy=S.checkpoint_inputs,
        differentiable=False,
        no_backward="a mean of checkpoints after training: nothing of the paper differentiates it",
    ),
    Equation(
        name="encoder_layer",
        title="encoder layer (§3.1)",
        short="encoder layer",
        arguments=("x", "params", "num_heads", "mask"),
        policies=_eps,
        oracle=lambda a: ref_model.encoder_layer(a["x"], a["params"], a["num_heads"], a["mask"], eps=a["eps"]),
        budget=lambda a, e, p: PR.encoder_layer(a["x"], a["params"], a["num_heads"], a["mask"], a["eps"], p),
        oracle_share=PROPAGATED,
        budget_name="first-order bound, budgets.composites.forward.encoder_layer",
        model=D.encoder_layer,
        model_policies=_layers_model,
        departures=_LAYER_FAMILIES,
        strategy=S.encoder_inputs,
        batch=_ENCODER_BATCH,
        backward=Backward(
            gradients=("x",),
            names=lambda a: ("x", *_parameter_paths(a)),
            oracle=lambda a, g: ref_model.encoder_layer_vjp(
                a["x"], a["params"], a["num_heads"], g, a["mask"], eps=a["eps"]
            ),
            budget=lambda a, g, p: BP.encoder_layer(a["x"], a["params"], a["num_heads"], a["mask"], a["eps"], g, p),
            oracle_share=PROPAGATED,
            budget_name="first-order bound of the VJP, budgets.composites.backward.encoder_layer",
        ),
    ),
    Equation(
        name="decoder_layer",
        title="decoder layer (§3.1, §3.2.3)",
        short="decoder layer",
        arguments=("y", "memory", "params", "num_heads", "self_mask", "memory_mask"),
        policies=_eps,
        oracle=lambda a: ref_model.decoder_layer(
            a["y"], a["memory"], a["params"], a["num_heads"], a["self_mask"], a["memory_mask"], eps=a["eps"]
        ),
        budget=lambda a, e, p: PR.decoder_layer(
            a["y"], a["memory"], a["params"], a["num_heads"], a["self_mask"], a["memory_mask"], a["eps"], p
        ),
        oracle_share=PROPAGATED,
        budget_name="first-order bound, budgets.composites.forward.decoder_layer",
        model=D.decoder_layer,
        model_policies=_layers_model,
        departures=_LAYER_FAMILIES | {"causal"},
        strategy=S.decoder_inputs,
        batch=_DECODER_BATCH,
        backward=Backward(
            gradients=("y", "memory"),
            names=lambda a: ("y", "memory", *_parameter_paths(a)),
            oracle=lambda a, g: ref_model.decoder_layer_vjp(
                a["y"], a["memory"], a["params"], a["num_heads"], g, a["self_mask"], a["memory_mask"], eps=a["eps"]
            ),
            budget=lambda a, g, p: BP.decoder_layer(
                a["y"], a["memory"], a["params"], a["num_heads"], a["self_mask"], a["memory_mask"], a["eps"], g, p
            ),
            oracle_share=PROPAGATED,
            budget_name="first-order bound of the VJP, budgets.composites.backward.decoder_layer",
        ),
    ),
    Equation(
        name="encoder_layer_training",
        title="encoder layer in training mode (§3.1, §5.4's residual dropout)",
        short="encoder layer, training",
        arguments=ENCODER_TRAINING_ARGUMENTS,
        call=_layer_training_call("encoder_layer_training", ENCODER_TRAINING_ARGUMENTS, ref_model.ENCODER_SUBLAYERS),
        oracle_name="encoder_layer (keep=, p_drop=)",
        policies=_eps,
        oracle=lambda a: ref_model.encoder_layer(
            a["x"], a["params"], a["num_heads"], a["mask"], eps=a["eps"], keep=a["keep"], p_drop=a["p"]
        ),
        budget=lambda a, e, prec: PR.encoder_layer(
            a["x"], a["params"], a["num_heads"], a["mask"], a["eps"], prec, keep=a["keep"], p=a["p"]
        ),
        oracle_share=PROPAGATED,
        budget_name="first-order bound with dropout's stages, budgets.composites.forward.encoder_layer",
        model=D.encoder_layer,
        model_policies=_layers_model,
        departures=_LAYER_FAMILIES | {"dropout"},
        strategy=S.encoder_training_inputs,
        differentiable=False,
        no_backward="not yet: the evaluation layer's VJP with each sub-layer's cotangent masked and scaled",
    ),
    Equation(
        name="decoder_layer_training",
        title="decoder layer in training mode (§3.1, §5.4's residual dropout)",
        short="decoder layer, training",
        arguments=DECODER_TRAINING_ARGUMENTS,
        call=_layer_training_call("decoder_layer_training", DECODER_TRAINING_ARGUMENTS, ref_model.DECODER_SUBLAYERS),
        oracle_name="decoder_layer (keep=, p_drop=)",
        policies=_eps,
        oracle=lambda a: ref_model.decoder_layer(
            a["y"],
            a["memory"],
            a["params"],
            a["num_heads"],
            a["self_mask"],
            a["memory_mask"],
            eps=a["eps"],
            keep=a["keep"],
            p_drop=a["p"],
        ),
        budget=lambda a, e, prec: PR.decoder_layer(
            a["y"],
            a["memory"],
            a["params"],
            a["num_heads"],
            a["self_mask"],
            a["memory_mask"],
            a["eps"],
            prec,
            keep=a["keep"],
            p=a["p"],
        ),
        oracle_share=PROPAGATED,
        budget_name="first-order bound with dropout's stages, budgets.composites.forward.decoder_layer",
        model=D.decoder_layer,
        model_policies=_layers_model,
        departures=_LAYER_FAMILIES | {"causal", "dropout"},
        strategy=S.decoder_training_inputs,
        differentiable=False,
        no_backward="not yet: the evaluation layer's VJP with each sub-layer's cotangent masked and scaled",
    ),
    Equation(
        name="transformer_forward",
        title="full forward pass (Figure 1, §3.1-§3.5)",
        short="whole model",
        arguments=("src", "tgt", "params", "num_heads", "src_lengths", "tgt_lengths"),
        policies=_eps,
        oracle=lambda a: ref_model.transformer_forward(
            a["src"],
            a["tgt"],
            a["params"],
            a["num_heads"],
            src_lengths=a["src_lengths"],
            tgt_lengths=a["tgt_lengths"],
            eps=a["eps"],
        ),
        budget=lambda a, e, p: PR.transformer_forward(
            a["src"], a["tgt"], a["params"], a["num_heads"], a["src_lengths"], a["tgt_lengths"], a["eps"], p
        ),
        oracle_share=PROPAGATED,
        budget_name="first-order bound, budgets.composites.forward.transformer_forward",
        model=D.transformer_forward,
        model_policies=_layers_model,
        departures=_LAYER_FAMILIES | {"causal", "positional", "embedding", "final_norm"},
        strategy=S.forward_inputs,
        batch=_MODEL_BATCH,
        undefined=_padded_targets,
        backward=Backward(
            gradients=(),
            names=_parameter_paths,
            oracle=lambda a, g: ref_model.transformer_forward_vjp(
                a["src"],
                a["tgt"],
                a["params"],
                a["num_heads"],
                g,
                src_lengths=a["src_lengths"],
                tgt_lengths=a["tgt_lengths"],
                eps=a["eps"],
            ),
            budget=lambda a, g, p: BP.transformer_forward(
                a["src"], a["tgt"], a["params"], a["num_heads"], a["src_lengths"], a["tgt_lengths"], a["eps"], g, p
            ),
            oracle_share=PROPAGATED,
            budget_name="first-order bound of the VJP, budgets.composites.backward.transformer_forward",
        ),
        decode=Decode(
            steps=("encode", "decode_step", "reorder_cache"),
            search=("beam_search",),
            budget_name="the forward budget at the step's positions; budgets.decoding.accumulated for beam scores",
            search_oracle=ref_decoding.beam_search,
            length_penalty=ref_decoding.length_penalty,
            agreement=(CACHED_STEPS, BEAM_SEARCH),
            # a sentence: its source (padding hidden by its length) and the target fed to the cached decoder
            steps_batch=Batching(
                core=lambda a: {"src": 1, "tgt": 1, "src_lengths": 0},
                lengths={"src_lengths": "src"},
                positions=("src",),
                rows="tgt",
            ),
            search_batch=Batching(
                core=lambda a: {"src": 1, "src_lengths": 0},
                lengths={"src_lengths": "src"},
                positions=("src",),
                rows="src",
            ),
        ),
    ),
    Equation(
        name="transformer_forward_training",
        title="full forward pass in training mode (Figure 1, §5.4's residual dropout)",
        short="whole model, training",
        arguments=MODEL_TRAINING_ARGUMENTS,
        call=_model_training_call,
        oracle_name="transformer_forward (keep=, p_drop=)",
        policies=_eps,
        oracle=lambda a: ref_model.transformer_forward(
            a["src"],
            a["tgt"],
            a["params"],
            a["num_heads"],
            src_lengths=a["src_lengths"],
            tgt_lengths=a["tgt_lengths"],
            eps=a["eps"],
            keep=a["keep"],
            p_drop=a["p"],
        ),
        budget=lambda a, e, prec: PR.transformer_forward(
            a["src"],
            a["tgt"],
            a["params"],
            a["num_heads"],
            a["src_lengths"],
            a["tgt_lengths"],
            a["eps"],
            prec,
            keep=a["keep"],
            p=a["p"],
        ),
        oracle_share=PROPAGATED,
        budget_name="first-order bound with dropout's stages, budgets.composites.forward.transformer_forward",
        model=D.transformer_forward,
        model_policies=_layers_model,
        departures=_LAYER_FAMILIES | {"causal", "positional", "embedding", "final_norm", "dropout"},
        strategy=S.forward_training_inputs,
        undefined=_padded_targets,
        differentiable=False,
        no_backward="not yet: the evaluation model's VJP with each dropped array's cotangent masked and scaled",
    ),
)

#: Every record, by equation name, in paper order.
RECORDS: Mapping[str, Equation] = MappingProxyType({r.name: r for r in _RECORDS})


def record(name: str) -> Equation:
    """The record of equation ``name``, or a KeyError naming the known equations."""
    try:
        return RECORDS[name]
    except KeyError:
        raise KeyError(f"no equation record {name!r}; known: {', '.join(RECORDS)}") from None


def title(name: str) -> str:
    """The equation's name in reports and messages, with its place in the paper (also for the contract's row)."""
    return _CONTRACT_TITLE if name == CONTRACT else RECORDS[name].title if name in RECORDS else name
