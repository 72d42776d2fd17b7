"""The Python package without a GPU, and mostly without torch: one version in one place, the
wheel's metadata, and the refusal to load an extension built for another torch."""

import importlib
import importlib.util
import os
import re
import sys
import types

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _version():
    spec = importlib.util.spec_from_file_location(
        "_swiftqk_version", os.path.join(ROOT, "python", "swiftqk", "_version.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.__version__


def _pyproject():
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_one_version_read_by_cmake_and_the_wheel():
    version = _version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake = f.read()
    assert "python/swiftqk/_version.py" in cmake and "VERSION ${SWIFTQK_VERSION}" in cmake
    assert not re.search(r"project\([^)]*VERSION \d", cmake)  # no second copy
    meta = _pyproject()
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    provider = meta["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["input"] == "python/swiftqk/_version.py"


def test_wheel_metadata_is_complete():
    project = _pyproject()["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert os.path.exists(os.path.join(ROOT, "LICENSE"))
    assert project["readme"] == "README.md"
    assert project["urls"]["Homepage"] == "https://github.com/swiftqk/swiftqk"
    assert any(c.startswith("License :: OSI Approved :: Apache") for c in project["classifiers"])
    assert set(project["optional-dependencies"]) == {"bench", "test"}
    assert "matplotlib" in project["optional-dependencies"]["bench"]
    assert "pytest" in project["optional-dependencies"]["test"]
    assert any(d.startswith("torch") for d in project["dependencies"])


@pytest.fixture
def fresh_swiftqk(monkeypatch):
    """Imports of swiftqk inside the test start from scratch and leave no trace after it."""
    for name in [n for n in sys.modules if n == "swiftqk" or n.startswith("swiftqk.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n == "swiftqk" or n.startswith("swiftqk.")]:
        del sys.modules[name]


def _fake_torch(version):
    torch = types.ModuleType("torch")
    torch.__version__ = version
    return torch


def _fake_module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def test_a_wheel_built_for_another_torch_is_refused_before_loading(fresh_swiftqk, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch("2.9.0+cu130"))
    monkeypatch.setitem(sys.modules, "swiftqk._build_info",
                        _fake_module("swiftqk._build_info", TORCH_VERSION="2.5.1+cu124"))
    # The module itself must not even be loaded: a stand-in that fails if imported.
    monkeypatch.setitem(sys.modules, "swiftqk._C", None)
    with pytest.raises(ImportError) as e:
        importlib.import_module("swiftqk")
    msg = str(e.value)
    assert "2.5.1+cu124" in msg and "2.9.0+cu130" in msg
    assert msg.count(". ") == 0 and msg.endswith(".")  # one sentence


def test_a_developer_build_for_another_torch_is_refused(fresh_swiftqk, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch("2.9.0"))
    monkeypatch.setitem(sys.modules, "swiftqk._C",
                        _fake_module("swiftqk._C", TORCH_VERSION="2.8.0"))
    with pytest.raises(ImportError, match=r"built against torch 2\.8\.0 but torch 2\.9\.0"):
        importlib.import_module("swiftqk")


def test_without_torch_the_import_says_so(fresh_swiftqk, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="swiftqk needs PyTorch"):
        importlib.import_module("swiftqk")
