"""The registry (implementations/registry.py): names, ``module:attr``, entry points, clear failures.

Built-in names map to ``"module:attr"`` strings imported only when chosen (a NumPy run
never imports torch); third parties register through the entry-point group
``aiayn.implementations`` or are named directly; unknown names and import failures give one
clear message listing the known names.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiayn.implementations import protocol, registry
from aiayn.implementations.registry import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    ImplementationNotFound,
    InvalidImplementation,
    load,
)

TORCH_MISSING = importlib.util.find_spec("torch") is None
EXAMPLE = "aiayn.implementations.examples.my_attention:MyAttention"


def _skip_if_needs_missing_torch(name: str) -> None:
    if name.startswith("torch") and TORCH_MISSING:
        pytest.skip(f"built-in {name!r} needs torch, which is not installed (pip install '.[torch]')")


# --------------------------------------------------------------------------------------------
# resolving


@pytest.mark.parametrize("name", list(BUILTINS))
def test_every_builtin_name_resolves_to_a_conforming_implementation_of_that_name(name: str) -> None:
    _skip_if_needs_missing_torch(name)
    impl = load(name)
    assert protocol.contract_problems(impl) == [], (
        f"load({name!r}) broke the contract: {protocol.contract_problems(impl)}"
    )
    assert isinstance(impl, protocol.Implementation)
    assert impl.name == name, f"load({name!r}) gave an implementation named {impl.name!r}; expected the registry name"


def test_builtin_targets_are_module_attr_strings_inside_implementations() -> None:
    for name, target in BUILTINS.items():
        module, _, attr = target.partition(":")
        assert module.startswith("aiayn.implementations.") and attr, (
            f"BUILTINS[{name!r}] = {target!r}: expected 'aiayn.implementations.<module>:<attr>'"
        )


def test_known_names_lists_the_builtins_first_in_order() -> None:
    names = registry.known_names()
    assert names[: len(BUILTINS)] == list(BUILTINS), (
        f"known_names() = {names}; expected it to start with {list(BUILTINS)}"
    )


def test_numpy_blocked_forces_the_blocked_attention_path() -> None:
    assert load("numpy-blocked").attention == "blocked"
    assert load("numpy").attention == "auto"


def _write_module(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(source))


_PLUGIN_SOURCE = """
    from aiayn.implementations.examples.my_attention import MyAttention

    class Nested:
        @staticmethod
        def make():
            impl = MyAttention()
            impl.name = "nested"
            return impl

    def factory():
        impl = MyAttention()
        impl.name = "from-factory"
        return impl

    INSTANCE = MyAttention()
    INSTANCE.name = "the-instance"
"""


@pytest.mark.parametrize(
    ("attr", "expected_name"),
    [
        ("MyAttention", "my-attention"),
        ("factory", "from-factory"),
        ("INSTANCE", "the-instance"),
        ("Nested.make", "nested"),
    ],
    ids=["class", "factory", "instance", "dotted-factory"],
)
def test_module_attr_accepts_a_class_a_factory_an_instance_and_a_dotted_attr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attr: str, expected_name: str
) -> None:
    _write_module(tmp_path, "aiayn_test_plugin_forms", _PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "aiayn_test_plugin_forms", raising=False)
    impl = load(f"aiayn_test_plugin_forms:{attr}")
    assert impl.name == expected_name, (
        f"load('aiayn_test_plugin_forms:{attr}').name = {impl.name!r}, expected {expected_name!r}"
    )


def test_the_example_third_party_implementation_loads_and_provides_two_equations() -> None:
    impl = load(EXAMPLE)
    assert protocol.provided_equations(impl) == {"softmax", "scaled_dot_product_attention"}
    assert not isinstance(impl, protocol.ImplementationBase), (
        "the example must satisfy the protocol structurally, not by subclassing"
    )


def _install_fake_distribution(site: Path, entry_points: str) -> None:
    """A real ``*.dist-info`` (what pip writes) declaring ``entry_points`` for our group."""
    info = site / "aiayn_test_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: aiayn-test-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{textwrap.dedent(entry_points)}")


def test_an_entry_point_is_listed_and_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_distribution(tmp_path, f"from-entry-point = {EXAMPLE}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "from-entry-point" in registry.known_names(), (
        f"known_names() = {registry.known_names()} misses the entry point"
    )
    impl = load("from-entry-point")
    assert type(impl).__name__ == "MyAttention" and protocol.contract_problems(impl) == []


def test_a_builtin_name_shadows_an_entry_point_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_fake_distribution(tmp_path, f"numpy = {EXAMPLE}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.known_names().count("numpy") == 1
    assert type(load("numpy")).__name__ == "NumpyImplementation"


# --------------------------------------------------------------------------------------------
# failing clearly


def _assert_lists_known_names(message: str) -> None:
    for name in registry.known_names():
        assert name in message, f"error message does not list the known name {name!r}: {message}"


def test_an_unknown_name_raises_with_every_known_name_in_the_message() -> None:
    with pytest.raises(ImplementationNotFound, match="'no-such-impl': unknown name") as info:
        load("no-such-impl")
    _assert_lists_known_names(str(info.value))
    assert isinstance(info.value, LookupError)


def test_an_entry_point_name_appears_in_the_unknown_name_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_fake_distribution(tmp_path, f"listed-plugin = {EXAMPLE}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplementationNotFound, match="listed-plugin"):
        load("nope")


@pytest.mark.parametrize(
    ("spec", "underlying"),
    [
        ("aiayn_no_such_module:Impl", "ModuleNotFoundError"),
        ("aiayn.implementations.protocol:NoSuchAttr", "AttributeError"),
        ("aiayn.implementations.protocol:", "ValueError"),
    ],
    ids=["bad-module", "bad-attr", "empty-attr"],
)
def test_import_failures_name_the_underlying_error_and_the_known_names(spec: str, underlying: str) -> None:
    with pytest.raises(ImplementationNotFound, match=underlying) as info:
        load(spec)
    _assert_lists_known_names(str(info.value))
    assert spec in str(info.value)


def test_a_broken_entry_point_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_distribution(tmp_path, "broken = aiayn_no_such_module:Impl\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplementationNotFound, match="ModuleNotFoundError") as info:
        load("broken")
    _assert_lists_known_names(str(info.value))


_BAD_SOURCE = """
    from aiayn.implementations.examples.my_attention import MyAttention

    class NoMembers:
        pass

    class BadPolicy(MyAttention):
        policies = {**MyAttention.policies, "fully_masked": "ignore"}

    class MissingPolicy(MyAttention):
        policies = {"fully_masked": "nan"}

    class BadDtype(MyAttention):
        dtypes = ("float64", "float8")

    class PhantomEquation(MyAttention):
        def provides(self):
            return frozenset({"softmax", "layer_norm"})

    class UnknownEquation(MyAttention):
        def provides(self):
            return frozenset({"softmax", "attention_2"})

    def raising_factory():
        raise RuntimeError("no GPU here")
"""


@pytest.mark.parametrize(
    ("attr", "complaint"),
    [
        ("NoMembers", "missing member"),
        ("BadPolicy", "policies\\['fully_masked'\\]"),
        ("MissingPolicy", "missing key\\(s\\) \\['label_smoothing', 'layer_norm_eps', 'step_zero'\\]"),
        ("BadDtype", "'float8' is not one of"),
        ("PhantomEquation", "declares 'layer_norm' but the object has no callable"),
        ("UnknownEquation", "'attention_2' is not one of EQUATIONS"),
    ],
)
def test_a_non_conforming_object_is_rejected_naming_the_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attr: str, complaint: str
) -> None:
    _write_module(tmp_path, "aiayn_test_bad_plugins", _BAD_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "aiayn_test_bad_plugins", raising=False)
    with pytest.raises(InvalidImplementation, match=complaint):
        load(f"aiayn_test_bad_plugins:{attr}")


def test_a_failing_factory_is_reported_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_module(tmp_path, "aiayn_test_bad_plugins", _BAD_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "aiayn_test_bad_plugins", raising=False)
    with pytest.raises(ImplementationNotFound, match="RuntimeError: no GPU here") as info:
        load("aiayn_test_bad_plugins:raising_factory")
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("spec", ["", None, 3])
def test_a_non_string_or_empty_spec_is_rejected(spec: object) -> None:
    with pytest.raises(ImplementationNotFound, match="expected a non-empty string"):
        load(spec)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# imports on demand


def test_loading_numpy_never_imports_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import aiayn.implementations
        from aiayn.implementations.registry import load, known_names
        known_names()
        for name in ("numpy", "numpy-blocked"):
            impl = load(name)
            x = impl.from_numpy(np.ones((3, 4)), "float32")
            impl.to_numpy(impl.scaled_dot_product_attention(x, x, x))
        print("torch" in sys.modules)
        """
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, f"subprocess failed:\n{result.stderr}"
    assert result.stdout.strip() == "False", (
        f"importing the registry and loading 'numpy' imported torch (stdout {result.stdout!r})"
    )
