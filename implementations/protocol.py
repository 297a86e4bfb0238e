"""The plug-in contract: what an implementation of the Transformer's equations must look like.

aiayn checks *implementations* of the equations of "Attention Is All You Need" (Vaswani et al.,
2017) against its oracle (``reference/``). Anything that satisfies :class:`Implementation` can
be checked: our own NumPy and PyTorch implementations, adapters over PyTorch's built-in modules,
or your own code. The contract itself depends only on NumPy: arrays cross the boundary as NumPy
arrays, whatever the implementation uses inside.

How the suite talks to an implementation
----------------------------------------
1. It reads the declarations: :attr:`Implementation.name`, :attr:`~Implementation.version`,
   :attr:`~Implementation.device`, :attr:`~Implementation.dtypes`,
   :attr:`~Implementation.policies` and :meth:`~Implementation.provides`.
2. For each provided equation and declared dtype it draws float64 inputs, converts them with
   :meth:`~Implementation.from_numpy` (which rounds them to the dtype), calls the equation on
   those *native* arrays, and converts the answer back with :meth:`~Implementation.to_numpy`.
3. The oracle is run on exactly the rounded inputs the implementation saw, and the difference is
   compared with an error budget derived for that equation and dtype.

The suite never assumes what a native array is (a NumPy array, a ``torch.Tensor`` on a GPU,
...): it only ever hands back to an implementation what that implementation's own
:meth:`~Implementation.from_numpy` produced.

The equations
-------------
An implementation provides any subset of :data:`EQUATIONS`, as methods with the oracle's names
and argument orders (documented on :class:`CompleteImplementation`). What it lacks is reported
as "not provided", never as an error. :func:`provided_equations` is the one place the suite asks
which equations to run.

Where the paper is silent, the implementation *declares* its choice in
:attr:`~Implementation.policies` (see :data:`POLICY_CHOICES`), and the suite checks it against
the oracle configured the same way.

Gradients (the backward pass)
-----------------------------
The suite also checks an equation's gradients against the oracle's VJP (``aiayn.reference``'s ``*_vjp``), for a
cotangent of the result. Nothing is required: what an implementation does not give is reported "not provided".
It gets them, in this order (``conformance/run/gradients.py``):

1. from its own method ``vjp(equation, args, d_out)``, if it has one: ``equation`` an equation's name, ``args``
   the native arguments exactly as the equation's method takes them, ``d_out`` a native cotangent of the result's
   shape in the call's dtype. It returns a mapping from argument name (the method's parameter names, as the
   oracle names them: ``"q"``, ``"k"``, ``"v"``; ``"x"``, ``"gain"``, ``"bias"``; ``"logits"``; a composite's
   parameters by dotted path, ``"self_attn.w_q"``, ``"encoder.0.ffn.w1"``, ``"embedding"``; ...) to a native
   gradient of that argument's shape and dtype, and raises ``NotImplementedError`` for an equation it does not
   differentiate. A NumPy implementation writes these by hand: ``implementations/numpy_backward.py`` is the
   built-in's (including the FlashAttention-style backward from a saved log-sum-exp);
2. where its arrays are ``torch.Tensor``, from autograd through the equation's method (no code needed; a method
   run under ``torch.no_grad()`` gives no gradient and is reported so);
3. where its arrays are ``jax.Array``, from ``jax.vjp`` of the method.

Gradients are judged like results: the declared dtype, the declared device, and every element within a derived
budget (``conformance/budgets/backward.py``). ``aiayn check --no-grad`` skips them.

Decoding (§3.2.3, §6.1)
-----------------------
The suite also checks how an implementation generates, where it provides these methods (each group optional;
what is absent is reported "not provided"):

- ``encode(src_tokens, params, num_heads, src_lengths=None)``: the encoder stack, the memory (B, n_src, d_model);
- ``decode_step(tokens, memory, params, num_heads, cache=None, src_lengths=None)``: the next k target tokens
  ``tokens`` (B, k) int64 through the decoder after the c positions its ``cache`` holds (None: none yet), at absolute
  positions c .. c + k - 1; returns ``(logits, cache)``, the logits (B, k, vocab) at those positions and the cache of
  c + k positions. The cache is the implementation's own object: the suite only hands it back, to ``decode_step``
  and to ``reorder_cache(cache, index)``, which returns the cache of batch rows ``index`` (B',) int64 (rows may
  repeat: beam search's reordering); it never uses a cache again once it has passed it on, so either may update it
  in place. A step must give what :meth:`~CompleteImplementation.transformer_forward`
  gives at those positions for the whole prefix (the decoder is causal, §3.2.3);
- ``beam_search(src_tokens, params, num_heads, beam, alpha, max_lengths, bos, eos, src_lengths=None)``: §6.1's
  beam search with GNMT's length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, the paper's [38]) over the
  implementation's own model, started from ``bos``; ``max_lengths`` (B,) int64, the most tokens each sentence may
  generate (§6.1: input length + 50). Returns a list of B pairs (tokens, score): the generated ids as Python ints
  (``eos`` last when the hypothesis ended) and log P(tokens | source) / lp(|Y|) as a Python float (unpenalised for a
  hypothesis cut at the maximum length that a search which drops those returns because none ended, as
  tensor2tensor does). Where §6.1 is
  silent it follows ``policies["beam_search"]``, a mapping of ``BEAM_POLICY_CHOICES`` (absent keys: the defaults,
  ``DEFAULT_BEAM_POLICIES``), both in ``implementations/decoding.py``.

Split keys (§3.2.1)
-------------------
Attention over a concatenation of key blocks is the merge of the blocks' outputs by their log-sum-exps (the
identity is proven in ``aiayn.reference.attention``, "split keys"): what split-KV decoding and paged-attention kernels
compute. An implementation may provide (both or neither; absent: "not provided"):

- ``attention_with_lse(q, k, v, mask=None)``: Eq. (1) over one block of keys, q (..., n_q, d_k), k (..., n_k, d_k),
  v (..., n_k, d_v), mask as Eq. (1)'s; returns ``(out, lse)``, out (..., n_q, d_v) in the call's dtype and lse
  (..., n_q), log sum_j exp(q . k_j / sqrt(d_k)) over the visible keys, in the call's dtype (or float32 for a
  float16 or bfloat16 call). A query that sees no key of the block (n_k = 0 included) gets out 0 and lse -inf,
  whatever ``policies["fully_masked"]`` says for the whole attention;
- ``merge_attention_states(outs, lses)``: outs (P, ..., n_q, d_v) and lses (P, ..., n_q), P >= 1, the states of P
  blocks in the call's dtype (-inf: an empty block); returns ``(out, lse)`` of all the blocks together: out =
  sum_p exp(L_p - L) O_p, lse = L = log sum_p exp(L_p); 0 and -inf where no block is alive.

And, on its own, Eq. (1) over a paged cache (vLLM's PagedAttention layout):

- ``paged_attention(q, k_pages, v_pages, block_table, lengths)``: q (B, n_q, d_k), k_pages (N, page, d_k) and
  v_pages (N, page, d_v) a pool of pages in any physical order, block_table (B, M) int64 (sentence b's position t is
  slot t mod page of page ``block_table[b, t // page]``), lengths (B,) int64 in [1, M page]; returns (B, n_q, d_v),
  each query attending to its sentence's first ``lengths[b]`` positions. The slots past a length, and pages in no
  table, hold anything (the suite fills them with NaN or +-1e4): nothing may reach the result from them.

Writing your own
----------------
Either subclass :class:`ImplementationBase` (sensible defaults, ``provides()`` for free), or
write any class with the members of :class:`Implementation` (structural typing; no import of
aiayn needed). ``implementations/examples/my_attention.py`` is a short example of the latter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "DTYPES",
    "INDEX_DTYPE",
    "MASK_DTYPE",
    "ARRAY_DTYPES",
    "EQUATIONS",
    "MASK_KINDS",
    "BIAS_GROUPS",
    "POLICY_CHOICES",
    "DEFAULT_POLICIES",
    "DECLARED_PROPERTIES",
    "Implementation",
    "CompleteImplementation",
    "ImplementationBase",
    "Scope",
    "Unsupported",
    "provided_equations",
    "contract_problems",
    "scope_of",
    "flushes_subnormals",
    "writes_out",
]

#: Floating-point dtypes an implementation may declare in :attr:`Implementation.dtypes`,
#: named as strings so that the contract does not depend on any array library.
#: ``float64``/``float32``/``float16`` are IEEE binary64/32/16; ``bfloat16`` is the 8-bit
#: exponent, 8-bit significand format. Conversions from float64 round to nearest, ties to even.
DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")

#: The dtype :meth:`Implementation.from_numpy` is asked for token ids, targets and lengths.
INDEX_DTYPE: str = "int64"

#: The dtype :meth:`Implementation.from_numpy` is asked for attention masks (True = may attend).
MASK_DTYPE: str = "bool"

#: Every dtype string :meth:`Implementation.from_numpy` may be asked for.
ARRAY_DTYPES: tuple[str, ...] = DTYPES + (INDEX_DTYPE, MASK_DTYPE)

#: The equations of the paper, by the oracle's function names (``reference/``), in paper order.
EQUATIONS: tuple[str, ...] = (
    "softmax",  # §3.2.1, inside Eq. (1)
    "scaled_dot_product_attention",  # §3.2.1, Eq. (1)
    "multi_head_attention",  # §3.2.2
    "positional_encoding",  # §3.5
    "layer_norm",  # §3.1 (LayerNorm(x + Sublayer(x)))
    "feed_forward",  # §3.3, Eq. (2)
    "lrate",  # §5.3, Eq. (3)
    "adam_step",  # §5.3 (Adam, Kingma & Ba 2015, Algorithm 1)
    "label_smoothing",  # §5.4
    "smoothed_cross_entropy",  # §5.4
    "dropout",  # §5.4 (residual dropout, P_drop)
    "average_checkpoints",  # §6.1
    "encoder_layer",  # §3.1
    "decoder_layer",  # §3.1
    "encoder_layer_training",  # §3.1 with §5.4's residual dropout
    "decoder_layer_training",  # §3.1 with §5.4's residual dropout
    "transformer_forward",  # §3.1-§3.5, Figure 1
    "transformer_forward_training",  # Figure 1 with §5.4's residual dropout
)

#: The policies an implementation declares where the paper leaves a choice open, and the values
#: each may take. ``layer_norm_eps`` is not listed: it is any positive float.
#:
#: Each value is what some real code does; the paper fixes none of them.
#:
#: - ``"fully_masked"`` — Eq. (1) on a query row whose keys are all masked out: ``"nan"`` (what
#:   softmax over a row of -inf gives, 0/0: the whole output row is NaN; a plain -inf
#:   implementation), ``"zeros"`` (the output row is 0: PyTorch's ``scaled_dot_product_attention``
#:   "safe softmax") or ``"uniform"`` (every key weighs 1/n_k, the row's output is the mean of the
#:   values: what a *finite* mask value gives, e.g. ``masked_fill(mask == 0, -1e9)`` in the
#:   Annotated Transformer and many tutorials; a finite mask is a departure elsewhere, see
#:   ``conformance/diagnoses/forward.py``, but on a fully masked row it is this well-defined choice).
#: - ``"label_smoothing"`` — §5.4 with eps_ls over K classes: ``"K"`` ((1 - eps) * onehot + eps/K;
#:   Szegedy et al.), ``"K-1"`` (target gets 1 - eps, every other class eps/(K-1); tensor2tensor)
#:   or ``"K-2"`` (a padding class, ``policies.get("padding_id", 0)``, gets 0 and eps is spread over
#:   the other K-2 classes; rows whose target is padding are all 0: the Annotated Transformer's
#:   ``LabelSmoothing`` and toolkits that ignore the padding index).
#: - ``"step_zero"`` — Eq. (3) at step 0, where step^-0.5 is infinite: ``"zero"`` (min(inf, 0) = 0,
#:   the formula's own limit), ``"raise"`` (refused: ValueError, or any exception) or ``"one"``
#:   (step 0 is computed as step 1:
#:   the Annotated Transformer's ``rate()``, ``if step == 0: step = 1``).
#: - ``"adam_eps"`` (optional, default ``"outside"``) — where Adam's epsilon enters its step (§5.3 cites Kingma & Ba,
#:   whose Algorithm 1 writes m_hat / (sqrt(v_hat) + eps)): ``"outside"`` (Algorithm 1: torch.optim.Adam,
#:   optax.adam), ``"hat"`` (their "more efficient" order, §2: lr sqrt(1 - beta2^t) / (1 - beta1^t) m / (sqrt(v) + eps),
#:   eps added to the uncorrected sqrt(v): Keras, TensorFlow) or ``"inside"`` (m_hat / sqrt(v_hat + eps)).
#: - ``"adam_bias_correction"`` (optional, default True) — Adam divides its moments by 1 - beta^t (Algorithm 1);
#:   False: the moments are used as they are.
#: - ``"flush_subnormals"`` (optional, default none) — where the implementation's arithmetic
#:   flushes subnormal results to zero (FTZ/DAZ: fast-math builds, XLA's CPU backend, PyTorch's CPU
#:   flash-attention kernel in bfloat16) instead of IEEE gradual underflow: a mapping from dtype to
#:   the equations (names in ``EQUATIONS``) computed that way in it, e.g.
#:   ``{"bfloat16": ("scaled_dot_product_attention", "multi_head_attention", ...)}``. A composite
#:   (layer, whole model) is listed when a part it calls flushes. The paper says nothing of
#:   arithmetic; the budgets of a listed (equation, dtype) take 2^emin, the smallest normal number,
#:   as the absolute error of an underflow instead of the subnormal spacing
#:   (``conformance/numerics.py``, "<dtype>-ftz"), and its report row says so. Read it with
#:   :func:`flushes_subnormals`.
#: - ``"batch_invariant"`` (optional, default False) — True declares that a batch element's result has the same bits
#:   whatever else is in its batch: computed alone, or at another index beside other elements of other lengths
#:   (vLLM's and Thinking Machines' batch invariance). Undeclared, the suite still requires each arrangement to agree
#:   with the oracle within its budget, and reports how many ulps apart they came out
#:   (``conformance/checks/invariance.py``).
#: - ``"deterministic"`` (optional, default False) — True declares that gradients rerun with the same inputs have the
#:   same bits (a forward result always must: the contract calls each method twice). Undeclared, the spread of the
#:   reruns is reported.
#: - ``"writes_out"`` (optional, default none) — the equations (names in ``EQUATIONS``) whose methods take a keyword
#:   ``out``: a native array of the result's shape and the call's dtype, made by the suite, into which the method
#:   writes the result and which it returns. The suite hands it one filled with NaN, then one filled with the dtype's
#:   largest value, and fails any element left unwritten (``conformance/checks/canaries.py``). Read it with
#:   :func:`writes_out`.
POLICY_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "fully_masked": ("nan", "zeros", "uniform"),
        "label_smoothing": ("K", "K-1", "K-2"),
        "step_zero": ("zero", "raise", "one"),
        "adam_eps": ("outside", "hat", "inside"),
    }
)

#: The optional policies that declare a property of the implementation's arithmetic (True or False, absent: False).
DECLARED_PROPERTIES: tuple[str, ...] = ("batch_invariant", "deterministic")

#: The oracle's defaults, used by :class:`ImplementationBase`. ``layer_norm_eps = 1e-6`` is the
#: authors' tensor2tensor value (PyTorch's ``nn.LayerNorm`` default is 1e-5).
DEFAULT_POLICIES: Mapping[str, object] = MappingProxyType(
    {"fully_masked": "nan", "label_smoothing": "K", "layer_norm_eps": 1e-6, "step_zero": "zero"}
)

#: The kinds of attention mask the suite draws (:attr:`Scope.masks`): no mask, the causal mask
#: (§3.2.3), a padding mask over the keys, and an arbitrary boolean mask.
MASK_KINDS: tuple[str, ...] = ("none", "causal", "padding", "random")


#: The parameter groups a :class:`Scope` can declare without bias terms (``Scope.no_bias``).
BIAS_GROUPS: tuple[str, ...] = ("attention", "layer_norm", "ffn")


class Unsupported(Exception):
    """Raise it from an equation for an input outside what the implementation supports.

    For limits the :class:`Scope` vocabulary cannot express. The suite counts such examples per
    equation and never fails on them; a report row whose examples were mostly unsupported is
    inconclusive, not a pass. Any other exception is a failure of the check.
    """


@dataclass(frozen=True)
class Scope:
    """The sub-domain an implementation supports for one equation (:attr:`ImplementationBase.scope`).

    The suite draws inputs only inside it (an input outside is never a failure) and every report
    row names the scope it was checked under, so "pass within scope: self-attention only" cannot be
    read as full conformance. Every field's default is the full domain.

    - ``self_attention_only``: Eq. (1) only with n_q = n_k; multi-head attention only with
      query, key and value the same array (decoder-only code, e.g. a GPT block);
    - ``masks``: the mask kinds accepted (:data:`MASK_KINDS`), e.g. ``("causal",)`` for code
      that always applies a causal mask (the contract's causal mask is then always passed);
    - ``layer_norm_eps``: LayerNorm's ``eps`` argument is fixed at this value (code with a
      hard-wired eps; the layers' eps is the ``layer_norm_eps`` policy);
    - ``batch_dims``: the numbers of leading batch dimensions accepted, e.g. ``(1,)`` for
      (B, n, d) only;
    - ``d_ff_ratio``: the feed-forward width is this multiple of d_model (e.g. 4);
    - ``max_length``: the longest sequence (queries, keys, positions);
    - ``dtypes``: the dtypes of this equation, a subset of the implementation's;
    - ``no_bias``: parameter groups the code has no bias terms for (:data:`BIAS_GROUPS`):
      ``"attention"`` (b_q, b_k, b_v, b_o absent: the paper's §3.2.2 has none), ``"layer_norm"``
      (LayerNorm's additive bias is 0), ``"ffn"`` (b1 = b2 = 0);
    - ``shared_key_value``: multi-head attention's key and value are one array (code whose
      cross-attention takes a single memory tensor, e.g. Hugging Face's ``key_value_states``);
    - ``note``: anything else a reader must know (what ``Unsupported`` is raised for);
    - ``note_directions``: the rows the note concerns, of ``"forward"``, ``"backward"`` (gradients) and ``"decode"``
      (e.g. ``("forward", "backward")`` for a note on target padding, which a decoder fed its own tokens never meets).
    """

    self_attention_only: bool = False
    masks: tuple[str, ...] = MASK_KINDS
    layer_norm_eps: float | None = None
    batch_dims: tuple[int, ...] | None = None
    d_ff_ratio: int | None = None
    max_length: int | None = None
    dtypes: tuple[str, ...] | None = None
    no_bias: tuple[str, ...] = ()
    shared_key_value: bool = False
    note: str = ""
    note_directions: tuple[str, ...] = ("forward", "backward", "decode")

    def describe(self, direction: str | None = None) -> str:
        """One line for the report: ``"full domain"`` or the restrictions, e.g.
        ``"self-attention only; masks causal"``; for a row of ``direction``, the note only where it concerns it."""
        parts = []
        if self.self_attention_only:
            parts.append("self-attention only")
        if tuple(self.masks) != MASK_KINDS:
            parts.append("masks " + ", ".join(self.masks) + " only")
        if self.layer_norm_eps is not None:
            parts.append(f"eps = {self.layer_norm_eps:g}")
        if self.batch_dims is not None:
            parts.append("batch dims " + "/".join(map(str, self.batch_dims)))
        if self.d_ff_ratio is not None:
            parts.append(f"d_ff = {self.d_ff_ratio} d_model")
        if self.max_length is not None:
            parts.append(f"length <= {self.max_length}")
        if self.dtypes is not None:
            parts.append("dtypes " + ", ".join(self.dtypes))
        if self.no_bias:
            parts.append("no " + ", ".join(g.replace("_", " ") for g in self.no_bias) + " biases")
        if self.shared_key_value:
            parts.append("key = value")
        if self.note and (direction is None or direction in self.note_directions):
            parts.append(self.note)
        return "; ".join(parts) or "full domain"

    def unmet(self, needs: Any) -> list[str]:
        """Which of a check's ``needs`` this scope excludes (empty: the check is inside the scope).

        A need is ``"masks:KIND"`` (a mask kind of :data:`MASK_KINDS`), ``"cross-attention"``
        (n_q != n_k, or distinct query and key), ``"batch:N"`` (at least N batch dimensions),
        ``"batchdims:N"`` (exactly N), ``"eps:V"`` (LayerNorm eps V), ``"d_ff:R"`` (d_ff = R d_model),
        ``"length:N"`` (sequences of N), ``"bias:GROUP"`` (non-zero biases of a :data:`BIAS_GROUPS`
        group) or ``"distinct-kv"`` (key and value different arrays).
        """
        out = []
        for need in needs:
            kind, _, value = str(need).partition(":")
            # Each lambda reads ``value`` late, but the one picked is called below in this same iteration.
            excluded = {
                "masks": lambda: value not in self.masks,  # noqa: B023
                "cross-attention": lambda: self.self_attention_only,
                "batch": lambda: self.batch_dims is not None and max(self.batch_dims) < int(value),  # noqa: B023
                "batchdims": lambda: self.batch_dims is not None and int(value) not in self.batch_dims,  # noqa: B023
                "eps": lambda: self.layer_norm_eps is not None and float(value) != self.layer_norm_eps,  # noqa: B023
                "d_ff": lambda: self.d_ff_ratio is not None and int(value) != self.d_ff_ratio,  # noqa: B023
                "length": lambda: self.max_length is not None and int(value) > self.max_length,  # noqa: B023
                "bias": lambda: value in self.no_bias,  # noqa: B023
                "distinct-kv": lambda: self.shared_key_value,
            }.get(kind)
            if excluded is None:
                raise ValueError(f"need {need!r}: unknown kind {kind!r}")
            if excluded():
                out.append(str(need))
        return out

    def problems(self) -> list[str]:
        """Every field holding a value the suite cannot use (empty: valid)."""
        out = [f"masks: {m!r} is not one of {MASK_KINDS}" for m in self.masks if m not in MASK_KINDS]
        if not self.masks:
            out.append("masks: expected at least one mask kind")
        if self.layer_norm_eps is not None and policy_problem("layer_norm_eps", self.layer_norm_eps):
            out.append(f"layer_norm_eps: {policy_problem('layer_norm_eps', self.layer_norm_eps)}")
        if self.batch_dims is not None and (
            not self.batch_dims or any(not isinstance(b, int) or b < 0 for b in self.batch_dims)
        ):
            out.append(f"batch_dims: expected non-negative ints, got {self.batch_dims!r}")
        for name in ("d_ff_ratio", "max_length"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                out.append(f"{name}: expected a positive int, got {value!r}")
        out += [f"no_bias: {g!r} is not one of {BIAS_GROUPS}" for g in self.no_bias if g not in BIAS_GROUPS]
        if self.dtypes is not None and any(d not in DTYPES for d in self.dtypes):
            out.append(f"dtypes: expected a subset of {DTYPES}, got {self.dtypes!r}")
        rows = ("forward", "backward", "decode")
        if not isinstance(self.note_directions, tuple) or any(d not in rows for d in self.note_directions):
            out.append(f"note_directions: expected a tuple of {rows}, got {self.note_directions!r}")
        return out


#: The full domain (no restriction).
FULL_SCOPE = Scope()


def scope_of(impl: Any, equation: str) -> Scope:
    """The scope ``impl`` declares for ``equation``: ``impl.scope[equation]``, else ``impl.scope["*"]``, else the full
    domain."""
    declared = getattr(impl, "scope", None)
    if not isinstance(declared, Mapping):
        return FULL_SCOPE
    scope = declared.get(equation, declared.get("*", FULL_SCOPE))
    return scope if isinstance(scope, Scope) else FULL_SCOPE


@runtime_checkable
class Implementation(Protocol):
    """What every implementation declares and how arrays cross its boundary.

    These members are required. The equations are optional methods (see
    :class:`CompleteImplementation` for their exact signatures and meaning); an implementation
    says which it has through :meth:`provides`.

    ``isinstance(obj, Implementation)`` checks only that the members exist (Python's runtime
    protocol check); :func:`contract_problems` also checks their values.
    """

    name: str
    """Short registry name, e.g. ``"numpy"`` or ``"torch-sdpa"``; used in reports and file names."""

    version: str
    """Free-form version of what is being checked, e.g. ``"numpy 2.4.0"`` or
    ``"torch 2.13.0+cpu"``; reports record it so a result can be tied to a library release."""

    device: str
    """Where the native arrays live: ``"cpu"``, ``"cuda"``, ``"cuda:0"``, ... Informational: the
    suite never moves arrays itself; it goes through :meth:`from_numpy` / :meth:`to_numpy`."""

    dtypes: tuple[str, ...]
    """Floating-point dtypes supported by every provided equation, a non-empty subset of
    :data:`DTYPES`, most precise first. The suite checks each equation in each of them. The first
    is also the dtype of results computed from no float input (:meth:`CompleteImplementation.label_smoothing`)."""

    policies: Mapping[str, object]
    """Declared choices where the paper is silent; at least the keys of :data:`DEFAULT_POLICIES`
    (further, implementation-specific keys are allowed and ignored by the suite):

    - ``"fully_masked"``: ``"nan"`` | ``"zeros"`` | ``"uniform"`` (Eq. (1) on a query with no visible key);
    - ``"label_smoothing"``: ``"K"`` | ``"K-1"`` | ``"K-2"`` (§5.4 variant; ``"K-2"`` with the
      optional ``"padding_id"``, default 0);
    - ``"layer_norm_eps"``: positive float, the eps inside the encoder/decoder layers' LayerNorms;
    - ``"step_zero"``: ``"zero"`` | ``"raise"`` | ``"one"`` (Eq. (3) at step 0).

    :data:`POLICY_CHOICES` says who makes each choice.

    The suite configures the oracle with these values and checks the implementation against it.
    """

    def provides(self) -> frozenset[str]:
        """Return the names (a subset of :data:`EQUATIONS`) of the equations implemented here.

        The suite runs exactly ``provides()`` ∩ {callable attributes} (see
        :func:`provided_equations`); every other equation is reported as not provided.
        """
        ...

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        """Return a native array holding ``array`` converted to ``dtype``, on :attr:`device`.

        ``dtype`` is one of :attr:`dtypes` (floating point), ``"int64"`` (token ids, targets,
        lengths) or ``"bool"`` (masks, True = may attend). Float conversion rounds to nearest
        (ties to even), so for ``"float32"``/``"float16"`` the values must equal NumPy's own
        ``array.astype(dtype)``. The result must not share memory with ``array``, at once or lazily: an edit of
        ``array`` after this call returns must not change it (checked). Raise ``ValueError`` naming the dtype if it
        is not supported.

        What the suite requires of a result in ``dtype``: every value that :meth:`to_numpy` gives back is a
        ``dtype`` number; and where the native array has a ``dtype`` attribute whose contract name can be read
        (NumPy's name of it, or a printed name ending in a contract name after its last dot, ``torch.float32``),
        that name is ``dtype``. A library whose dtypes print under names of its own (``dtypes.double``) is judged by
        its values alone, unless the implementation defines ``dtype_name(native_dtype) -> str`` giving the
        contract's name.
        """
        ...

    def to_numpy(self, x: Any) -> np.ndarray:
        """Return a NumPy copy of the native array ``x`` (host memory, never a view).

        Floating-point arrays of any precision come back as ``float64`` (exactly: widening is
        lossless), integer arrays as ``int64``, boolean arrays as ``bool``. Shapes are kept.

        A result with a ``device`` attribute must be on :attr:`device`, by meaning: case aside, the same name, the
        same with an index (``"cuda"`` and ``"cuda:0"``), or the declared name as one word of the native one
        (``"TFRT_CPU_0"`` on ``"cpu"``).
        """
        ...


class CompleteImplementation(Implementation, Protocol):
    """An :class:`Implementation` that provides every equation in :data:`EQUATIONS`.

    This documents each equation's signature and meaning; it is for type checkers and readers.
    Real implementations usually provide a subset, so the suite never requires this protocol.

    Conventions shared by all equations:

    - Arguments named as arrays are *native* arrays made by :meth:`~Implementation.from_numpy`:
      float arrays all in one dtype from :attr:`~Implementation.dtypes`, masks ``"bool"`` (True =
      may attend), token ids / targets / lengths ``"int64"``.
    - ``params`` are (nested) dicts of native float arrays in the oracle's canonical layout (see
      :meth:`multi_head_attention`, :meth:`encoder_layer`, :meth:`decoder_layer`,
      :meth:`transformer_forward`).
    - Results are native arrays in the dtype of the float inputs, with the shapes stated.
    - Inputs are never modified in place.
    - Leading "batch" dimensions ``...`` broadcast as in NumPy where stated.
    - Dropout is applied only by the methods that say so (:meth:`dropout`, the layers' ``*_training`` methods, which
      return the masks they drew); every other method is the deterministic function (evaluation mode).
    """

    def softmax(self, x: Any, axis: int = -1) -> Any:
        """Softmax of ``x`` along ``axis``: exp(x_i) / sum_j exp(x_j) (§3.2.1, inside Eq. (1)).

        Any shape; result has the shape and dtype of ``x``. Must not overflow for large entries
        (shift by the maximum, or equivalent).
        """
        ...

    def scaled_dot_product_attention(self, q: Any, k: Any, v: Any, mask: Any | None = None) -> Any:
        """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2.1, Eq. (1)).

        Shapes: ``q`` (..., n_q, d_k), ``k`` (..., n_k, d_k), ``v`` (..., n_k, d_v); batch
        dimensions broadcast; result (..., n_q, d_v). ``mask`` (bool, optional) broadcasts to
        (..., n_q, n_k); ``mask[..., i, j]`` False means query i may not attend to key j (its
        score is -inf before the softmax, §3.2.3). A query row with every key masked follows
        ``policies["fully_masked"]``: ``"nan"`` → that output row is NaN, ``"zeros"`` → it is 0.
        """
        ...

    def multi_head_attention(
        self, query: Any, key: Any, value: Any, params: Mapping[str, Any], num_heads: int, mask: Any | None = None
    ) -> Any:
        """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2).

        Shapes: ``query`` (..., n_q, d_model), ``key``/``value`` (..., n_k, d_model); result
        (..., n_q, d_model). ``num_heads`` = h, a Python int.

        ``params`` (canonical layout): ``w_q`` (d_model, h*d_k), ``w_k`` (d_model, h*d_k),
        ``w_v`` (d_model, h*d_v), ``w_o`` (h*d_v, d_model), and optional biases ``b_q`` (h*d_k,),
        ``b_k`` (h*d_k,), ``b_v`` (h*d_v,), ``b_o`` (d_model,) (absent = zero). Head i uses
        columns ``i*d_k:(i+1)*d_k`` of ``w_q``/``w_k``, columns ``i*d_v:(i+1)*d_v`` of ``w_v``
        and the same rows of ``w_o``. Within a head the scale is 1/sqrt(d_k).

        ``mask`` (bool, optional) broadcasts to (..., n_q, n_k) and applies to every head; fully
        masked rows follow ``policies["fully_masked"]`` (the NaN or zero head outputs then go
        through W^O).
        """
        ...

    def positional_encoding(self, length: int, d_model: int, dtype: str) -> Any:
        """Sinusoidal positional encodings (§3.5), a native (length, d_model) array in ``dtype``.

        PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)).
        ``length`` >= 0 and ``d_model`` (even, > 0) are Python ints; ``dtype`` is one of
        :attr:`~Implementation.dtypes`. ``length == 0`` gives an empty (0, d_model) array.
        """
        ...

    def layer_norm(self, x: Any, gain: Any, bias: Any, eps: float) -> Any:
        """Layer normalisation over the last axis (§3.1, "LayerNorm(x + Sublayer(x))").

        (x - mean) / sqrt(var + eps) * gain + bias, with the biased (population) variance over the
        last axis and ``eps`` (a Python float) inside the square root. ``x`` (..., d_model),
        ``gain``/``bias`` (d_model,); result (..., d_model).
        """
        ...

    def feed_forward(self, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
        """Position-wise feed-forward network FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. (2)).

        ``x`` (..., d_model), ``w1`` (d_model, d_ff), ``b1`` (d_ff,), ``w2`` (d_ff, d_model),
        ``b2`` (d_model,); result (..., d_model).
        """
        ...

    def lrate(self, step: int, d_model: int, warmup_steps: int) -> float:
        """Learning rate schedule (§5.3, Eq. (3)): d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

        Python numbers in (``step`` >= 0), a Python float out. Step 0 follows
        ``policies["step_zero"]``: ``"zero"`` → 0.0, ``"raise"`` → a refusal. A negative step is refused. A
        refusal is ``ValueError`` by preference; any exception is accepted as one (the report names its type).
        """
        ...

    def adam_step(
        self, param: Any, grad: Any, m: Any, v: Any, step: int, lr: float, betas: tuple[float, float], eps: float
    ) -> tuple[Any, Any, Any]:
        """One step of Adam for one parameter (§5.3: beta1 = 0.9, beta2 = 0.98, eps = 1e-9; Kingma & Ba's Algorithm 1).

        m_t = beta1 m + (1 - beta1) grad; v_t = beta2 v + (1 - beta2) grad^2; the parameter moves by
        lr m_hat / (sqrt(v_hat) + eps), m_hat = m_t / (1 - beta1^t) and v_hat = v_t / (1 - beta2^t) (t = ``step`` >= 1,
        the first update being 1). ``param``, ``grad``, ``m``, ``v`` native arrays of one shape in the call's dtype;
        ``step`` a Python int, ``lr`` and ``eps`` Python floats, ``betas`` a pair of Python floats, all used as given
        (no defaults of a framework). Returns ``(param, m, v)`` after the step, new native arrays in the call's dtype;
        the inputs are left as they were. Where eps enters and whether the moments are corrected follow
        ``policies["adam_eps"]`` and ``policies["adam_bias_correction"]`` (absent: Algorithm 1). No weight decay.
        """
        ...

    def label_smoothing(self, targets: Any, vocab_size: int, eps: float) -> Any:
        """Smoothed target distributions (§5.4, eps_ls = ``eps``), one row per target.

        ``targets`` native int64 (...,) with values in [0, vocab_size); result (..., vocab_size)
        in the implementation's first dtype (``dtypes[0]``). The variant follows
        ``policies["label_smoothing"]``: ``"K"`` → (1 - eps) * onehot + eps / K; ``"K-1"`` → the
        target gets 1 - eps and every other class eps / (K - 1). Each row sums to 1.
        """
        ...

    def smoothed_cross_entropy(self, logits: Any, targets: Any, eps: float) -> Any:
        """Cross-entropy of softmax(``logits``) against the smoothed targets (§5.4), per position.

        -sum_c q(c) * log_softmax(logits)_c, with q = :meth:`label_smoothing` (same variant).
        ``logits`` (..., K) float, ``targets`` (...,) int64; result (...,) in the dtype of
        ``logits``. No reduction over positions, no padding exclusion.
        """
        ...

    def dropout(self, x: Any, p: float, seed: int) -> tuple[Any, Any]:
        """Dropout in training mode (§5.4, P_drop = ``p``; Srivastava et al. 2014, scaled at training time).

        Each element of ``x`` (a native float array of any shape) is kept with probability 1 - p, independently of
        the others, and scaled by 1 / (1 - p); a dropped one is 0. Returns ``(y, keep)``: y in the call's dtype, keep
        the mask drawn (a native bool array of x's shape, True = kept). ``seed`` (a Python int) fixes the draw: the
        same seed draws the same mask, different seeds independent ones.
        """
        ...

    def average_checkpoints(self, checkpoints: Mapping[int, Mapping[str, Any]], n: int) -> Mapping[str, Any]:
        """The model §6.1 evaluates: the element-wise mean of the last ``n`` checkpoints (5 for base, 20 for big).

        ``checkpoints`` maps each training step (a Python int) to its parameters, a mapping of names to native arrays
        in the call's dtype, every checkpoint with the same names and shapes, the steps in any order (as a directory
        lists them); "last" is by step. Returns a mapping of the same names to new native arrays in the call's dtype.
        """
        ...

    def encoder_layer(self, x: Any, params: Mapping[str, Any], num_heads: int, mask: Any | None = None) -> Any:
        """One encoder layer (§3.1): post-norm self-attention then feed-forward sub-layers.

        z = LayerNorm(x + MultiHead(x, x, x; mask)); out = LayerNorm(z + FFN(z)), with
        eps = ``policies["layer_norm_eps"]``, no dropout. ``x`` (..., n, d_model); result the same
        shape. ``mask`` (bool, optional) broadcasts to (..., n, n), e.g. a padding mask (B, 1, n).
        ``params``: ``{"self_attn": <MHA params>, "norm1": {"gain", "bias"},
        "ffn": {"w1", "b1", "w2", "b2"}, "norm2": {"gain", "bias"}}``.
        """
        ...

    def decoder_layer(
        self,
        y: Any,
        memory: Any,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: Any | None = None,
        memory_mask: Any | None = None,
    ) -> Any:
        """One decoder layer (§3.1): masked self-attention, encoder-decoder attention, feed-forward.

        a = LayerNorm(y + MultiHead(y, y, y; self_mask)); b = LayerNorm(a + MultiHead(a, memory,
        memory; memory_mask)); out = LayerNorm(b + FFN(b)); eps = ``policies["layer_norm_eps"]``.
        ``y`` (..., n_tgt, d_model), ``memory`` (..., n_src, d_model) (the encoder output);
        result (..., n_tgt, d_model). ``self_mask`` None means the causal mask (§3.2.3: query i
        sees keys j <= i); a given ``self_mask`` is used as is (combine causal and padding
        yourself). ``memory_mask`` broadcasts to (..., n_tgt, n_src); None means all visible.
        ``params``: ``{"self_attn", "norm1", "cross_attn", "norm2", "ffn", "norm3"}`` laid out as
        in :meth:`encoder_layer`.
        """
        ...

    def encoder_layer_training(
        self, x: Any, params: Mapping[str, Any], num_heads: int, p: float, seed: int, mask: Any | None = None
    ) -> tuple[Any, Any, Any]:
        """One encoder layer in training mode (§3.1 with §5.4's residual dropout, P_drop = ``p``).

        z = LayerNorm(x + Dropout(MultiHead(x, x, x; mask))); out = LayerNorm(z + Dropout(FFN(z))): "dropout to the
        output of each sub-layer, before it is added to the sub-layer input and normalized" (§5.4), each Dropout as
        :meth:`dropout` (kept with probability 1 - p, scaled by 1 / (1 - p)), and nowhere else (§5.4 names no dropout
        of the attention weights or of the feed-forward's hidden units). Arguments as :meth:`encoder_layer`; ``seed``
        (a Python int) fixes the draws: the same seed draws the same masks. Returns ``(out, keep_attn, keep_ffn)``:
        out (..., n, d_model) in the call's dtype, and the two masks drawn, native bool arrays of out's shape (True =
        kept): the self-attention's output's and the feed-forward's. Evaluation mode is :meth:`encoder_layer`, with no
        dropout.
        """
        ...

    def decoder_layer_training(
        self,
        y: Any,
        memory: Any,
        params: Mapping[str, Any],
        num_heads: int,
        p: float,
        seed: int,
        self_mask: Any | None = None,
        memory_mask: Any | None = None,
    ) -> tuple[Any, Any, Any, Any]:
        """One decoder layer in training mode (§3.1 with §5.4's residual dropout, P_drop = ``p``).

        :meth:`decoder_layer` with each sub-layer's output dropped before its residual sum, as
        :meth:`encoder_layer_training`. Returns ``(out, keep_self, keep_cross, keep_ffn)``: out (..., n_tgt, d_model)
        and the masks of the self-attention's, the encoder-decoder attention's and the feed-forward's outputs, native
        bool arrays of out's shape.
        """
        ...

    def transformer_forward(
        self,
        src_tokens: Any,
        tgt_tokens: Any,
        params: Mapping[str, Any],
        num_heads: int,
        src_lengths: Any | None = None,
        tgt_lengths: Any | None = None,
    ) -> Any:
        """The whole model (Figure 1, §3.1-§3.5) from token ids to pre-softmax logits.

        ``src_tokens`` (B, n_src), ``tgt_tokens`` (B, n_tgt) int64 (the decoder input, already
        shifted right); result (B, n_tgt, vocab) in the dtype of ``params``.

        Embeddings: E[tokens] * sqrt(d_model) + PE (§3.4, §3.5), with one matrix
        ``params["embedding"]`` (vocab, d_model) shared by source, target and the pre-softmax
        projection logits = h @ E^T (no sqrt(d_model) on the output side). Encoder:
        ``params["encoder"]``, a list of :meth:`encoder_layer` params applied in order; decoder:
        ``params["decoder"]``, a list of :meth:`decoder_layer` params. Post-norm, no final
        LayerNorm, no dropout, eps = ``policies["layer_norm_eps"]``. Optional
        ``params["positional"]`` (max_len >= n, d_model): learned positions (Table 3 row E) added
        instead of the sinusoids (an implementation without learned positions raises ``ValueError``
        when it is present, rather than ignoring it).

        Masks from lengths (int64 (B,), optional; None = no padding): encoder self-attention and
        encoder-decoder attention see source keys j < src_lengths[b]; decoder self-attention is
        causal and sees target keys j < tgt_lengths[b]. The logits at padded target positions
        (i >= tgt_lengths[b]) are not compared (no decoder defines them, nothing reads them): an
        implementation may return anything there; they are counted as not checked.
        """
        ...

    def transformer_forward_training(
        self,
        src_tokens: Any,
        tgt_tokens: Any,
        params: Mapping[str, Any],
        num_heads: int,
        p: float,
        seed: int,
        src_lengths: Any | None = None,
        tgt_lengths: Any | None = None,
    ) -> Mapping[str, Any]:
        """The whole model in training mode (Figure 1 with §5.4's residual dropout, P_drop = ``p``).

        :meth:`transformer_forward` with dropout, as :meth:`dropout`, "to the sums of the embeddings and the positional
        encodings in both the encoder and decoder stacks" and to each sub-layer's output before its residual sum (as
        :meth:`encoder_layer_training` and :meth:`decoder_layer_training`), nowhere else. ``seed`` (a Python int) fixes
        the draws. Returns a mapping: ``"logits"``, the logits (B, n_tgt, vocab) in the call's dtype, and the mask drawn
        at each place, a native bool array of the shape it drops (True = kept): ``"src_embedding"`` (B, n_src, d_model),
        ``"encoder.<i>.self_attn"`` and ``"encoder.<i>.ffn"`` for each encoder layer i (B, n_src, d_model),
        ``"tgt_embedding"`` (B, n_tgt, d_model), ``"decoder.<i>.self_attn"``, ``"decoder.<i>.cross_attn"`` and
        ``"decoder.<i>.ffn"`` (B, n_tgt, d_model) (``aiayn.reference.counts.dropout_places(N_enc, N_dec)`` lists
        them in the order applied). The logits at padded target positions are not compared.
        """
        ...


def provided_equations(impl: Any) -> frozenset[str]:
    """Return the equations the suite will run on ``impl``.

    That is ``impl.provides()`` ∩ :data:`EQUATIONS` ∩ {names that are callable attributes of
    ``impl``}: a declared but missing method is treated as not provided (and reported by
    :func:`contract_problems`), never as a crash halfway through a run.
    """
    declared = frozenset(impl.provides())
    return frozenset(n for n in declared if n in EQUATIONS and callable(getattr(impl, n, None)))


def contract_problems(impl: Any) -> list[str]:
    """Return every way ``impl`` breaks the contract's declarations (empty list = conforms).

    Checks the members of :class:`Implementation` exist and hold valid values: non-empty string
    ``name``/``version``/``device``, ``dtypes`` a non-empty tuple from :data:`DTYPES` without
    repeats, ``policies`` with every key of :data:`DEFAULT_POLICIES` and allowed values,
    ``provides()`` a subset of :data:`EQUATIONS` whose every name is a callable attribute. It
    does not call any equation.
    """
    problems: list[str] = []
    missing = [
        m
        for m in ("name", "version", "device", "dtypes", "policies", "provides", "from_numpy", "to_numpy")
        if not hasattr(impl, m)
    ]
    if missing:
        return [f"missing member(s) {', '.join(missing)} of the Implementation protocol"]
    for attr in ("name", "version", "device"):
        value = getattr(impl, attr)
        if not isinstance(value, str) or not value:
            problems.append(f"{attr}: expected a non-empty str, got {value!r}")
    problems += _dtype_problems(impl.dtypes)
    problems += _policy_problems(impl.policies)
    for method in ("provides", "from_numpy", "to_numpy"):
        if not callable(getattr(impl, method)):
            problems.append(f"{method}: expected a method, got {getattr(impl, method)!r}")
    if callable(impl.provides):
        problems += _provides_problems(impl)
    problems += _scope_problems(impl)
    return problems


def _scope_problems(impl: Any) -> list[str]:
    declared = getattr(impl, "scope", None)
    if declared is None:
        return []
    if not isinstance(declared, Mapping):
        return [f"scope: expected a mapping of equation (or '*') -> Scope, got {declared!r}"]
    out = []
    for key, scope in declared.items():
        if key != "*" and key not in EQUATIONS:
            out.append(f"scope: {key!r} is not one of EQUATIONS (or '*')")
        elif not isinstance(scope, Scope):
            out.append(f"scope[{key!r}]: expected an aiayn.implementations.protocol.Scope, got {scope!r}")
        else:
            out += [f"scope[{key!r}].{p}" for p in scope.problems()]
            if scope.dtypes is not None and not set(scope.dtypes) <= set(getattr(impl, "dtypes", ()) or ()):
                out.append(f"scope[{key!r}].dtypes: {scope.dtypes} are not all among the declared dtypes {impl.dtypes}")
    return out


def _dtype_problems(dtypes: Any) -> list[str]:
    if not isinstance(dtypes, tuple) or not dtypes:
        return [f"dtypes: expected a non-empty tuple drawn from {DTYPES}, got {dtypes!r}"]
    problems = [f"dtypes: {d!r} is not one of {DTYPES}" for d in dtypes if d not in DTYPES]
    if len(set(dtypes)) != len(dtypes):
        problems.append(f"dtypes: repeated entries in {dtypes!r}")
    return problems


def _is_names(names: Any) -> bool:
    return isinstance(names, (tuple, list, frozenset, set)) and all(isinstance(n, str) for n in names)


def flushes_subnormals(policies: Any, equation: str, dtype: str) -> bool:
    """Whether ``policies`` declare that ``equation`` in ``dtype`` flushes subnormal results to zero
    (policy ``"flush_subnormals"``): the budgets then assume FTZ arithmetic, "<dtype>-ftz"."""
    flushed = policies.get("flush_subnormals", {}) if isinstance(policies, Mapping) else {}
    names = flushed.get(dtype, ()) if isinstance(flushed, Mapping) else ()
    return _is_names(names) and equation in names


def policy_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` as the declared policy ``key`` (one of ``POLICY_CHOICES``; ``layer_norm_eps``:
    a positive float; one of ``DECLARED_PROPERTIES``: a bool), or None: the one validation of a policy value,
    wherever it is read."""
    if key in POLICY_CHOICES and value not in POLICY_CHOICES[key]:
        return f"expected one of {POLICY_CHOICES[key]}, got {value!r}"
    if key in DECLARED_PROPERTIES and not isinstance(value, bool):
        return f"expected True or False, got {value!r}"
    if key == "writes_out" and (
        not isinstance(value, (tuple, list, frozenset, set))
        or any(type(e) is not str or e not in EQUATIONS for e in value)
    ):
        return f"expected a tuple of equation names (EQUATIONS), got {value!r}"
    if key == "adam_bias_correction" and not isinstance(value, bool):
        return f"expected True or False, got {value!r}"
    if key == "layer_norm_eps" and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        return f"expected a positive float, got {value!r}"
    return None


def _policy_problems(policies: Any) -> list[str]:
    if not isinstance(policies, Mapping):
        return [f"policies: expected a mapping with keys {sorted(DEFAULT_POLICIES)}, got {policies!r}"]
    problems = []
    missing = sorted(set(DEFAULT_POLICIES) - set(policies))
    if missing:
        problems.append(f"policies: missing key(s) {missing}; every implementation declares {sorted(DEFAULT_POLICIES)}")
    for key in (*POLICY_CHOICES, "layer_norm_eps", "adam_bias_correction", *DECLARED_PROPERTIES, "writes_out"):
        problem = policy_problem(key, policies[key]) if key in policies else None
        if problem:
            problems.append(f"policies[{key!r}]: {problem}")
    flushed = policies.get("flush_subnormals", {})
    if not isinstance(flushed, Mapping) or not all(
        dtype in DTYPES and _is_names(names) and set(names) <= set(EQUATIONS) for dtype, names in flushed.items()
    ):
        problems.append(
            "policies['flush_subnormals']: expected a mapping from dtype (one of "
            f"{DTYPES}) to a tuple of equation names (in EQUATIONS), got {flushed!r}"
        )
    pad = policies.get("padding_id", 0)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        problems.append(
            "policies['padding_id']: expected a non-negative int (the padding class of label smoothing 'K-2'), got "
            f"{pad!r}"
        )
    return problems


def _provides_problems(impl: Any) -> list[str]:
    try:
        declared = impl.provides()
    except Exception as exc:  # a broken provides() is a contract problem to report, not a crash
        return [f"provides(): raised {type(exc).__name__}: {exc}"]
    if not isinstance(declared, (frozenset, set)):
        return [f"provides(): expected a frozenset of equation names, got {declared!r}"]
    problems = [f"provides(): {n!r} is not one of EQUATIONS" for n in sorted(map(str, declared)) if n not in EQUATIONS]
    problems += [
        f"provides(): declares {n!r} but the object has no callable {n}"
        for n in sorted(declared)
        if n in EQUATIONS and not callable(getattr(impl, n, None))
    ]
    return problems


class ImplementationBase:
    """A convenient concrete base for implementations (optional: the contract is structural).

    Gives the oracle's :data:`DEFAULT_POLICIES`, a :meth:`provides` that lists the
    :data:`EQUATIONS` defined as methods on the subclass, and :meth:`check_dtype`. A subclass sets
    the class attributes ``name``, ``version``, ``device`` and ``dtypes`` (or assigns them in
    ``__init__``), implements :meth:`from_numpy`/:meth:`to_numpy`, and defines the equations it
    provides as methods named as in :class:`CompleteImplementation`.

    Example::

        class Mine(ImplementationBase):
            name, version, device, dtypes = "mine", "0.1", "cpu", ("float64",)
            def from_numpy(self, array, dtype):
                return np.array(array, dtype=self.check_dtype(dtype, allow_index=True))
            def to_numpy(self, x):
                return np.array(x, dtype=np.float64 if x.dtype.kind == "f" else x.dtype)
            def softmax(self, x, axis=-1):
                e = np.exp(x - x.max(axis=axis, keepdims=True))
                return e / e.sum(axis=axis, keepdims=True)
    """

    name: str = ""
    version: str = ""
    device: str = "cpu"
    dtypes: tuple[str, ...] = ()
    policies: Mapping[str, object] = DEFAULT_POLICIES
    #: Optional. Conformance checks this implementation is known to fail, by name, with the reason:
    #: the test's name without ``test_`` plus its own parameters in brackets, e.g.
    #: ``"attention_poison_at_masked_positions_changes_nothing[nan_keys]"``, optionally followed by
    #: ``@<dtype>`` (e.g. ``...[huge]@float32``) to limit it to one dtype. The suite still runs
    #: them; a failure is reported as a known deviation with this reason, and a pass fails the
    #: run (the declaration must go once the deviation is gone). Declare only behaviour you
    #: cannot or will not change (e.g. a library's documented semantics), never to hide a bug.
    known_deviations: Mapping[str, str] = MappingProxyType({})
    #: Optional. The sub-domain supported per equation (``"*"``: every equation), see :class:`Scope`.
    scope: Mapping[str, Scope] = MappingProxyType({})
    #: Optional. Report rows accepted as inconclusive, with the reason: ``"equation"`` or
    #: ``"equation@dtype"`` -> why (``conformance/report/coverage.py``). Without it an inconclusive row fails the run.
    declared_inconclusive: Mapping[str, str] = MappingProxyType({})

    def provides(self) -> frozenset[str]:
        """Return the :data:`EQUATIONS` defined as callables on this object's class (or itself)."""
        return frozenset(n for n in EQUATIONS if callable(getattr(self, n, None)))

    def check_dtype(self, dtype: str, *, allow_index: bool = False) -> str:
        """Return ``dtype`` if this implementation supports it, else raise ``ValueError``.

        Supported means one of :attr:`dtypes`; with ``allow_index=True`` also ``"int64"`` and
        ``"bool"`` (what :meth:`from_numpy` must also accept).
        """
        allowed = self.dtypes + ((INDEX_DTYPE, MASK_DTYPE) if allow_index else ())
        if dtype not in allowed:
            raise ValueError(f"dtype: implementation {self.name!r} supports {allowed}, got {dtype!r}")
        return dtype

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        """See :meth:`Implementation.from_numpy`; subclasses must override."""
        raise NotImplementedError(f"{type(self).__name__} must define from_numpy(array, dtype)")

    def to_numpy(self, x: Any) -> np.ndarray:
        """See :meth:`Implementation.to_numpy`; subclasses must override."""
        raise NotImplementedError(f"{type(self).__name__} must define to_numpy(x)")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} device={self.device!r} dtypes={self.dtypes}>"


def writes_out(policies: Any) -> frozenset[str]:
    """The equations whose methods take ``out=`` (``policies["writes_out"]``, validated by :func:`policy_problem`;
    none where absent or invalid: an invalid declaration is the contract check's failure)."""
    if not isinstance(policies, Mapping) or "writes_out" not in policies:
        return frozenset()
    value = policies["writes_out"]
    return frozenset() if policy_problem("writes_out", value) else frozenset(value)
