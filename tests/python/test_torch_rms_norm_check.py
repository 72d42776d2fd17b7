"""bench/torch_rms_norm.py checks the PyTorch baseline against float64 before timing it: the
check passes torch's own rms_norm in bf16 and catches a wrong weight, scale or NaN (CPU)."""

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_rms_norm  # noqa: E402
from reference import random_rows, random_weight  # noqa: E402

F = torch.nn.functional


@pytest.mark.parametrize("width", [128, 1024, 5120])
def test_torch_rms_norm_in_bf16_passes(width):
    x = random_rows(16, width, torch.bfloat16, seed=width)
    w = random_weight(width, torch.bfloat16, seed=width + 1)
    assert torch_rms_norm.count_wrong(torch, F.rms_norm, x, w, 1e-6) == 0


def test_a_wrong_result_is_counted():
    x = random_rows(8, 1024, torch.bfloat16, seed=3)
    w = random_weight(1024, torch.bfloat16, seed=4)
    no_weight = lambda x, s, w, eps: F.rms_norm(x, s, None, eps)  # noqa: E731
    assert torch_rms_norm.count_wrong(torch, no_weight, x, w, 1e-6) > 1000
    # 1.6% off: twice the 2.25 bf16 roundings the bound allows, on every element.
    scaled = lambda x, s, w, eps: F.rms_norm(x, s, w, eps) * (1 + 2.0**-6)  # noqa: E731
    assert torch_rms_norm.count_wrong(torch, scaled, x, w, 1e-6) == x.numel()

    def one_nan(x, s, w, eps):
        y = F.rms_norm(x, s, w, eps)
        y[3, 7] = float("nan")
        return y

    assert torch_rms_norm.count_wrong(torch, one_nan, x, w, 1e-6) == 1
