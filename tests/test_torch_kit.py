"""The adapter kit for PyTorch modules (implementations/torch_kit.py), and the README's example adapter built on it.

The layouts are checked against hand-made values (not against the kit itself): nn.Linear's
transposed weight, the fused in-projection, every mask layout and kind, LayerNorm loading; modules
are built in float64 without changing torch's global default dtype. The README's
``nn.MultiheadAttention`` adapter, run by the conformance suite, passes within its scope.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from aiayn.implementations.torch_kit import (  # noqa: E402
    TorchAdapter,
    attention_mask,
    batched,
    build,
    causal_and_padding,
    copy_layer_norm,
    copy_linear,
    fused_qkv,
    padding_from_mask,
)

README = Path(__file__).resolve().parent.parent / "README.md"


def test_copy_linear_computes_x_at_w_plus_b():
    w, b, x = (
        torch.randn(3, 5, dtype=torch.float64),
        torch.randn(5, dtype=torch.float64),
        torch.randn(2, 3, dtype=torch.float64),
    )
    lin = nn.Linear(3, 5, dtype=torch.float64)
    copy_linear(lin, w, b)
    torch.testing.assert_close(lin(x), x @ w + b, rtol=0, atol=1e-14)
    no_bias = nn.Linear(3, 5, bias=False, dtype=torch.float64)
    with pytest.raises(ValueError, match="no bias"):
        copy_linear(no_bias, w, b)


def test_fused_qkv_stacks_transposed_weights_and_zero_absent_biases():
    params = {n: torch.full((2, 2), float(k)) for k, n in enumerate(("w_q", "w_k", "w_v"), 1)} | {
        "b_k": torch.tensor([7.0, 8.0])
    }
    weight, bias = fused_qkv(params, 2)
    assert weight.shape == (6, 2) and torch.equal(weight[2:4], torch.full((2, 2), 2.0))
    assert bias.tolist() == [0.0, 0.0, 7.0, 8.0, 0.0, 0.0]


def test_attention_mask_layouts_and_kinds():
    mask = torch.tensor([[[True, False, True]]])  # (1, 1, 3): key padding, True = may attend
    flat = attention_mask(mask, (2,), 2, 3, heads=2, layout="flat")  # (B*h, n_q, n_k), PyTorch's True = blocked
    assert flat.shape == (4, 2, 3) and flat[:, :, 1].all() and not flat[:, :, 0].any()
    heads = attention_mask(mask, (2,), 2, 3, heads=2, layout="heads", kind="allow")
    assert heads.shape == (2, 2, 2, 3) and torch.equal(heads[1, 1, 0], mask[0, 0])
    additive = attention_mask(mask, (2,), 2, 3, kind="additive")
    assert additive.dtype == torch.float32 and additive[0, 0].tolist() == [0.0, float("-inf"), 0.0]
    assert attention_mask(None, (2,), 2, 3) is None
    assert padding_from_mask(mask, 2).tolist() == [[True, False, True]] * 2
    assert padding_from_mask(torch.ones(1, 2, 3, dtype=torch.bool), 1) is None  # not a key-padding mask


@pytest.mark.parametrize(("n_q", "n_k"), [(3, 3), (2, 4)])
def test_causal_and_padding_recovers_what_the_contracts_mask_combines(n_q: int, n_k: int) -> None:
    """For code that takes a key-padding mask and builds its own (end-aligned) causal mask."""
    lengths = torch.tensor([n_k, n_k - 1])
    padding = torch.arange(n_k)[None, :] < lengths[:, None]  # (B, n_k)
    causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)  # (n_q, n_k)
    combined = padding[:, None, :] & causal  # (B, n_q, n_k): what the suite hands a decoder's self-attention
    got, is_causal = causal_and_padding(combined, (2,), n_q, n_k)
    assert is_causal and torch.equal(got, padding)
    got, is_causal = causal_and_padding(padding[:, None, :], (2,), n_q, n_k)  # (B, 1, n_k) key padding only
    assert not is_causal and torch.equal(got, padding)
    assert causal_and_padding(causal, (2,), n_q, n_k) == (None, True)  # causal alone: no padding
    assert causal_and_padding(None, (2,), n_q, n_k) == (None, False)
    scattered = combined.clone()
    scattered[0, 0, 0] = False  # a random mask: neither
    with pytest.raises(ValueError, match="neither key padding nor the causal mask"):
        causal_and_padding(scattered, (2,), n_q, n_k)


def test_build_and_layer_norm_keep_the_global_default_dtype():
    class A(TorchAdapter):
        name = "a"

    default = torch.get_default_dtype()
    m = build(A(device="cpu"), nn.LayerNorm, 4, dtype=torch.float64)
    assert m.weight.dtype == torch.float64 and not m.training and torch.get_default_dtype() == default
    copy_layer_norm(m, {"gain": torch.arange(4.0, dtype=torch.float64), "bias": torch.ones(4, dtype=torch.float64)})
    assert m.weight.tolist() == [0.0, 1.0, 2.0, 3.0] and m.bias.tolist() == [1.0] * 4
    assert batched(torch.zeros(3, 4), (2, 2)).shape == (4, 3, 4)


def test_the_readme_adapter_passes_within_its_scope(tmp_path: Path):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Checking code that is not yours") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "readme_mha.py").write_text(
        code + "\nfrom aiayn.implementations.protocol import Scope\n"
        'MHA.scope = {"multi_head_attention": Scope(batch_dims=(1,))}\n',
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]),
        "AIAYN_FAILURES": str(tmp_path / "failures"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "check",
            "readme_mha:MHA",
            "--profile",
            "smoke",
            "--workers",
            "0",
            "--report",
            str(tmp_path / "r"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "r" / "conformance-my-mha.json").read_text(encoding="utf-8"))
    row = next(r for r in data["rows"] if r["equation"] == "multi_head_attention" and r["dtype"] == "float64")
    assert row["status"] == "pass within scope" and row["checked"] > 0, row
