import glob
import importlib.util
import os
import sys

import pytest


def _has_extension(package_dir):
    return bool(glob.glob(os.path.join(package_dir, "_C*.so")))


# The source tree's package comes first, unless only an installed one has the extension (pip
# install --no-build-isolation . builds it into site-packages, not into the source tree): then
# the installed one is tested, so its GPU tests run instead of skipping.
_repo_python = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
_installed = importlib.util.find_spec("swiftqk")
if not (_installed is not None and _installed.origin is not None
        and _has_extension(os.path.dirname(_installed.origin))
        and not _has_extension(os.path.join(_repo_python, "swiftqk"))):
    sys.path.insert(0, _repo_python)

try:
    import torch
except ImportError:  # the test modules that need it skip themselves (pytest.importorskip)
    torch = None


def swiftqk_or_skip():
    try:
        import swiftqk  # noqa: F401
    except ImportError as e:  # the extension was not built
        pytest.skip(f"swiftqk._C is not built here ({e})")
    return swiftqk


def cuda_or_skip():
    if torch is None or not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine: GPU test skipped")


@pytest.fixture
def sq():
    """The swiftqk module, for a test that needs its built extension and a CUDA GPU; the test
    skips, saying which is missing, otherwise."""
    swiftqk = swiftqk_or_skip()
    cuda_or_skip()
    return swiftqk
