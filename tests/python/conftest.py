import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

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
