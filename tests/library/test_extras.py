"""A missing optional package is one line naming its extra and the pip command (`_src/extras.py`),
whichever feature imports it; the extras named are pyproject.toml's."""

import importlib
import sys
import tomllib
from pathlib import Path

import pytest

from jaxtrain import ConfigError
from jaxtrain._src.extras import BASE, EXTRAS, check_installed, missing_package, require

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_each_package_named_is_in_the_extra_named_for_it():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for module, extra in EXTRAS.items():
        packages = {p.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip() for p in extras[extra]}
        assert module in packages, (module, extra, packages)


@pytest.mark.parametrize("module", [*sorted(EXTRAS), "matplotlib", "h5py", "mctx"])
def test_a_missing_package_is_one_line_naming_its_extra(module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: its import raises ImportError
    extra = EXTRAS.get(module)
    command = f'pip install -e ".[{extra}]"' if extra else "pip install -e ."
    for check in (require, check_installed):
        with pytest.raises(ConfigError) as raised:
            check(module, "the feature")
        message = str(raised.value)
        assert message.startswith(f"the feature needs {module}, ") and message.endswith(f"run {command} in "
                                                                                         "jaxtrain's folder")
        assert "\n" not in message and raised.value.extra == extra and raised.value.package == module
    with pytest.raises(ImportError) as error:  # the command line's net: any import of it, from anywhere
        importlib.import_module(f"{module}.sub" if module != "h5py" else module)
    assert str(missing_package(error.value, "jaxtrain x")) == message.replace("the feature", "jaxtrain x")


def test_a_missing_dependency_of_an_optional_package_names_the_package_and_unknown_modules_pass(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna.visualization", None)  # one of its own modules, say
    monkeypatch.delitem(sys.modules, "optuna.visualization.matplotlib", raising=False)  # imported by another test
    with pytest.raises(ConfigError, match=r"needs optuna, .*pip install -e \"\.\[sweep\]\""):
        require("optuna.visualization.matplotlib", "jaxtrain sweep report")
    assert missing_package(ModuleNotFoundError("No module named 'mine'", name="mine"), "jaxtrain x") is None
    assert "matplotlib" in BASE and set(BASE).isdisjoint(EXTRAS)
