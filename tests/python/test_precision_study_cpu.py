"""bench/precision_study.py on the CPU, small sizes: the independent paths' errors are nonzero
and within the rounding bound of the output dtype, fp8's end-to-end error is e4m3's, and broken
norms (a wrong eps, bf16 arithmetic, the Llama order on an Olmo2 model) are caught by larger
errors; the re-implementation of the HF classes is theirs bit for bit; the command line writes
the rows and the table."""

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import precision_study as ps  # noqa: E402
from reference import ABSOLUTE_FLOOR, UNIT_ROUNDOFF  # noqa: E402

EPS = 1e-6
U = UNIT_ROUNDOFF[torch.bfloat16]  # 2^-8: the largest relative error of one bf16 rounding
F = torch.nn.functional


def outputs(norm, order, dtype, tokens=32, width=1024, seed=1, eps=EPS):
    """(output, gold of the stored inputs, gold of the values before quantisation or None)."""
    gen = torch.Generator().manual_seed(seed)
    w = ps.draw_weight(width, ps.torch_dtype(dtype), gen, "cpu")
    given, stored, original = ps.inputs_of(dtype, ps.draw_rows(tokens, width, gen, "cpu"))
    got = norm(given, w, eps, order)
    return got, ps.gold(stored, w, EPS), None if original is None else ps.gold(original, w, EPS)


def beyond(got, gold, roundings):
    """Elements past |got - gold| <= (roundings u + 1e-5) max(|gold|, floor): the C++ tests'
    bound (reference.cpp), 1.25 roundings for the Olmo2 order and 2.25 for Llama's."""
    bound = (roundings * U + 1e-5) * gold.abs().clamp_min(ABSOLUTE_FLOOR[torch.bfloat16])
    return int(((got.double() - gold).abs() > bound).sum())


def rmse(got, gold):
    return ps.pooled_errors([(got, gold)])["rmse"]


HF, HF_IMPL = ps.hf_classes()
METHODS = {name: norm for name, (norm, _) in ps.standard_methods(HF, HF_IMPL).items()}
ROUNDINGS = {"olmo2": 1.25, "llama": 2.25}


@pytest.mark.parametrize("order", ["olmo2", "llama"])
@pytest.mark.parametrize("method", ["torch_rms_norm", "hf_rmsnorm"])
def test_bf16_errors_are_nonzero_and_within_the_rounding_bound(method, order):
    got, gold, original = outputs(METHODS[method], order, "bf16")
    assert original is None  # bf16 inputs are stored as drawn: no end-to-end gold
    e = ps.pooled_errors([(got, gold)])
    assert e["max_abs_err"] > 0 and e["mean_abs_err"] > 0 and e["rmse"] > 0
    # HF rounds as the model's order does; PyTorch's own order is not the model's, so it gets
    # the looser bound of two roundings.
    roundings = ROUNDINGS[order] if method == "hf_rmsnorm" else ROUNDINGS["llama"]
    assert beyond(got, gold, roundings) == 0


@pytest.mark.parametrize("order", ["olmo2", "llama"])
@pytest.mark.parametrize("method", ["torch_rms_norm", "hf_rmsnorm"])
def test_fp8_own_error_is_bounded_and_end_to_end_is_e4m3s(method, order):
    got, gold, original = outputs(METHODS[method], order, "f8e4m3")
    # The dequantised values are rounded into bf16 before the norm: one more u.
    roundings = (ROUNDINGS[order] if method == "hf_rmsnorm" else ROUNDINGS["llama"]) + 1
    assert beyond(got, gold, roundings) == 0
    own, e2e = ps.pooled_errors([(got, gold)]), ps.pooled_errors([(got, original)], "_e2e")
    assert own["rmse"] > 0 and not torch.equal(gold, original)
    assert e2e["max_abs_err_e2e"] >= own["max_abs_err"]
    # e4m3's unit roundoff is 2^-4, 16 u: the end-to-end error is several times the method's
    # (observed 8.8-10.2x) and at most 2^-4 of the outputs' RMS in the RMS.
    assert e2e["rmse_e2e"] > 4 * own["rmse"]
    assert e2e["rmse_e2e"] < 2.0**-4 * float(original.square().mean().sqrt())


def wrong_eps(x, w, eps, order):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-2)  # eps read from the wrong field


def bf16_arithmetic(x, w, eps, order):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w  # no fp32 upcast


def llama_order(x, w, eps, order):
    return ps.REIMPLEMENTED["llama"](w, eps)(x)


@pytest.mark.parametrize("broken, order", [(wrong_eps, "olmo2"), (wrong_eps, "llama"),
                                           (bf16_arithmetic, "olmo2"),
                                           (bf16_arithmetic, "llama"), (llama_order, "olmo2")])
def test_broken_norms_give_larger_errors(broken, order):
    got, gold, _ = outputs(METHODS["hf_rmsnorm"], order, "bf16")
    bad, _, _ = outputs(broken, order, "bf16")
    # Observed: wrong eps 33-47x the RMSE, bf16 arithmetic 1.24-1.74x, the Llama order on an Olmo2
    # model 1.4x; each past the model's rounding bound somewhere.
    assert rmse(bad, gold) > 1.15 * rmse(got, gold)
    assert beyond(bad, gold, ROUNDINGS[order]) > 0


def test_a_missing_eps_is_below_what_the_study_resolves():
    # Rows have mean squares of at least ~1e-2 (magnitudes 0.1 to 10), so eps = 1e-6 moves 1/rms
    # by at most 5e-5 relative, far below bf16's 2^-8: the study cannot tell it is missing.
    def no_eps(x, w, eps, order):
        return F.rms_norm(x, (x.shape[-1],), w, 0.0)

    got, gold, _ = outputs(METHODS["torch_rms_norm"], "olmo2", "bf16")
    bad, _, _ = outputs(no_eps, "olmo2", "bf16")
    assert abs(rmse(bad, gold) / rmse(got, gold) - 1) < 0.01


@pytest.mark.parametrize("order", ["olmo2", "llama"])
def test_the_reimplementation_is_transformers_bit_for_bit(order):
    real, impl = ps.hf_classes()
    if not impl.startswith("transformers"):
        pytest.skip(f"transformers does not import here: {impl}")
    gen = torch.Generator().manual_seed(5)
    x = ps.draw_rows(16, 512, gen, "cpu").to(torch.bfloat16)
    w = ps.draw_weight(512, torch.bfloat16, gen, "cpu")
    with torch.no_grad():
        assert torch.equal(real[order](w, EPS)(x), ps.REIMPLEMENTED[order](w, EPS)(x))


def test_command_line_writes_the_rows_and_the_table(tmp_path, capsys):
    out = tmp_path / "study.json"
    assert ps.main(["--device", "cpu", "--models", "olmoe,olmo2-7b", "--tokens", "2",
                    "--dtypes", "bf16,fp8", "--no-transformers", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 2 * 2 * 2  # models x dtypes x methods
    for r in rows:
        assert r["max_abs_err"] > 0 and r["device"] == "cpu"
        assert ("rmse_e2e" in r) == (r["dtype"] == "f8e4m3")
        if r["method"] == "hf_rmsnorm":
            assert r["hf_impl"] == "re-implementation (--no-transformers)"
            assert r["hf_class"] == {"olmoe": "LlamaRMSNorm", "olmo2-7b": "Olmo2RMSNorm"}[
                r["model"]]
    text = capsys.readouterr().out
    assert "| input dtype | method | configs | max abs | mean abs | RMSE | max abs e2e |" in text
    assert "| f8e4m3 | torch_rms_norm | 2 |" in text and "| bf16 | hf_rmsnorm | 2 |" in text


def test_unknown_names_are_refused():
    with pytest.raises(SystemExit, match="unknown models"):
        ps.main(["--device", "cpu", "--models", "gpt-9"])
    with pytest.raises(SystemExit, match="unknown dtype"):
        ps.main(["--device", "cpu", "--dtypes", "int4"])
