"""Loads swiftqk._C, the compiled extension, only under the torch it was built against.

An extension built for another torch may fail to load with an undefined symbol, or load and
misbehave; either way the error would not say why. The build records its torch twice: in
_build_info.py (the wheel's, read before the module is loaded) and in _C.TORCH_VERSION (every
build's, developer builds included)."""

import importlib

import torch


def _refusal(built: str) -> ImportError:
    return ImportError(
        f"swiftqk's extension was built against torch {built} but torch {torch.__version__} is "
        "installed here, so reinstall swiftqk under this torch (pip install "
        "--no-build-isolation .).")


def load():
    """Returns the swiftqk._C module, or raises ImportError naming both torch versions."""
    installed = str(torch.__version__)
    try:
        _build_info = importlib.import_module("._build_info", __package__)
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}._build_info":
            raise
        # A developer build: only the module is copied into the source tree.
    else:
        if _build_info.TORCH_VERSION != installed:
            raise _refusal(_build_info.TORCH_VERSION)
    try:
        _C = importlib.import_module("._C", __package__)
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}._C":
            raise
        raise ImportError(
            "swiftqk._C, the compiled extension, is not built: pip install "
            "--no-build-isolation . (or configure CMake with -DSWIFTQK_BUILD_PYTHON=ON).") from e
    built = getattr(_C, "TORCH_VERSION", installed)
    if built != installed:
        raise _refusal(built)
    return _C
