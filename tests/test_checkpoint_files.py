"""aiayn train: a checkpoint is data, never code.

- resuming reads the newest checkpoint with torch's ``weights_only`` loader: a crafted one (a pickle whose
  ``__reduce__`` would write a canary file) is refused with one line naming the file, and nothing of it runs;
- a checkpoint whose fields are not those ``save_checkpoint`` writes is refused the same way, naming the field;
- what ``save_checkpoint`` writes loads under ``weights_only`` (resume itself: ``tests/test_translation.py``).
"""

from __future__ import annotations

import pathlib
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from aiayn.environment import UsageError  # noqa: E402
from aiayn.reference.counts import TransformerConfig  # noqa: E402
from aiayn.reproductions.translation import data as D  # noqa: E402
from aiayn.reproductions.translation.model import Transformer  # noqa: E402
from aiayn.reproductions.translation.train import TrainConfig, load_checkpoint, save_checkpoint, train  # noqa: E402

_CONFIG = TransformerConfig(n_layers=1, d_model=8, d_ff=8, num_heads=2, p_drop=0.0)
_TRAIN = TrainConfig(max_tokens=80, steps=2, warmup=2, checkpoint_steps=1, keep=5, log_steps=10**6)


class _Canary:
    """Unpickling it would write ``flag`` (any code at all could run there instead)."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.write_text, (self.flag, "unpickled"))


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(_CONFIG, D.synthetic_vocab().size, max_positions=64)


def _examples() -> list:
    vocab = D.synthetic_vocab()
    return D.encode_pairs(D.synthetic_pairs(60, 7), vocab)


def _saved(folder: Path) -> Path:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0)
    return save_checkpoint(folder, model, optimizer, step=1, cursor=(0, 1), keep=5, tokens=10, seconds=1.0)


def test_a_crafted_checkpoint_is_refused_on_resume_and_runs_nothing(tmp_path: Path) -> None:
    flag = tmp_path / "canary"
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"model": {}, "step": _Canary(flag)}, folder / "ckpt-7.pt")
    with pytest.raises(UsageError) as info:
        train(_model(), _examples(), _TRAIN, folder, log=lambda *a: None)
    message = str(info.value)
    assert message.startswith(f"{folder / 'ckpt-7.pt'}: refused, not a checkpoint of aiayn train") and (
        "\n" not in message
    ), message
    assert "it holds more than tensors, numbers, strings, lists and dicts" in message, message
    assert not flag.exists(), "unpickling the crafted checkpoint ran its code"


def test_the_command_refuses_a_crafted_checkpoint_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """Through ``aiayn train``'s own error path: exit 4, one line on stderr."""
    from aiayn import cli

    flag = tmp_path / "canary"
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"model": {}, "step": _Canary(flag)}, folder / "ckpt-3.pt")

    def run_train(args: Any) -> int:
        train(_model(), _examples(), _TRAIN, folder, log=lambda *a: None)
        return 0

    real = cli._translation
    monkeypatch.setattr(cli, "_translation", lambda name: run_train if name == "run_train" else real(name))
    assert cli.main(["train", "--preset", "smoke", "--work", str(tmp_path / "work")]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ckpt-3.pt: refused" in err and "Traceback" not in err, err
    assert not flag.exists()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda s: s.pop("step"), "field 'step' is missing"),
        (lambda s: s.update(step=-1), "field 'step' is int, expected an integer >= 0"),
        (lambda s: s.update(cursor=[0]), "field 'cursor' is list, expected a list of 2 integers >= 0"),
        (lambda s: s.update(rng=torch.zeros(3)), "field 'rng' is Tensor, expected a uint8 tensor"),
        (lambda s: s.update(model={"w": 1.0}), "field 'model' is dict, expected a dict of parameter name -> tensor"),
        (lambda s: s.update(seconds=float("nan")), "field 'seconds' is float"),
    ],
)
def test_a_checkpoint_with_a_wrong_field_is_refused_naming_it(tmp_path: Path, change: Any, named: str) -> None:
    path = _saved(tmp_path)
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)
    with pytest.raises(UsageError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: refused") and named in str(info.value), str(info.value)


@pytest.mark.parametrize(("content", "named"), [(b"", "it cannot be read as one"), (b"garbage", "it holds more than")])
def test_a_file_that_is_no_checkpoint_is_refused(tmp_path: Path, content: bytes, named: str) -> None:
    path = tmp_path / "ckpt-1.pt"
    path.write_bytes(content)
    with pytest.raises(UsageError) as info:
        load_checkpoint(path)
    assert named in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_what_save_checkpoint_writes_loads_as_data(tmp_path: Path) -> None:
    state = load_checkpoint(_saved(tmp_path))
    assert (state["step"], state["cursor"], state["tokens"], state["seconds"]) == (1, [0, 1], 10, 1.0)
    assert state["rng"].dtype == torch.uint8 and set(state["optimizer"]) == {"state", "param_groups"}
