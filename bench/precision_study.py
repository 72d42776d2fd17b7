#!/usr/bin/env python3
"""The precision study of independent paths: the error against float64 of PyTorch's
torch.nn.functional.rms_norm and of Hugging Face's RMSNorm classes on the full (gathered) Q and
K, to stand beside swiftqk_bench's figures for SwiftQK and All-Gather (both of which normalise
with SwiftQK's own kernel) in bench/precision_table.py.

    python3 bench/precision_study.py --json results/precision_study.json
    python3 bench/precision_table.py results/procs_tp2.json results/procs_fp8_tp2.json \\
        results/precision_study.json

Inputs: the distribution of tests/support/problem.cpp, drawn with torch's generator (the same
distribution, not the same values as the C++ run): float32 normal values, each row scaled by 10^u
with u uniform in [-1, 1), zeros replaced by 1e-3; weights uniform in [0.25, 2), rounded to the
output dtype. bf16 (f16, f32) inputs are those values rounded to the dtype. fp8-e4m3 inputs are
the values over a per-tensor scale amax / 448 (float32), cast with saturation; a method gets them
dequantised into bf16 ((x8 * scale) in float32, then rounded to bf16: the activations a bf16
model's modules take), outputs bf16.

Methods, on the same inputs per configuration:
  torch_rms_norm  torch.nn.functional.rms_norm(x, (width,), weight, eps): PyTorch's own kernel
                  and order, whatever the model's;
  hf_rmsnorm      each model's norm order as Hugging Face implements it (bench/models.json):
                  olmo2, Olmo2RMSNorm (fp32, x * rsqrt(mean(x^2) + eps), weight * that in fp32,
                  rounded once); llama, LlamaRMSNorm (the same, rounded, then weight * it: OLMoE's
                  OlmoeRMSNorm is the same code). The classes of transformers when it imports,
                  else a re-implementation of their forward (the row's hf_impl says which).

Gold: float64 w * x / sqrt(mean(x^2) + eps) of the stored inputs (fp8: the dequantised values;
the error of the method itself: max_abs_err, mean_abs_err, rmse) and, for fp8 only, of the values
before quantisation (end to end, the paper's Fig. 2(b): max_abs_err_e2e, mean_abs_err_e2e,
rmse_e2e). Q and K are pooled per configuration, as swiftqk_bench pools them. The fp8 path's own
error includes the rounding of the dequantised values into bf16 (at most 2^-8 of a value), which
SwiftQK, dequantising in fp32, does not have; against e4m3's 2^-4 it is small end to end.

Runs on CUDA when there is a GPU, else on the CPU (--device). Prints the table of
precision_table.py; --json writes the rows.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_shapes  # noqa: E402
import precision_table  # noqa: E402

try:
    import torch
except ImportError:  # main() says so and measures nothing
    torch = None

E4M3_MAX = 448.0
# Input dtype names as swiftqk_bench writes them, and the aliases it parses (types.hpp).
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "fp16": "f16",
                 "float16": "f16", "f32": "f32", "fp32": "f32", "float32": "f32",
                 "fp8": "f8e4m3", "f8e4m3": "f8e4m3", "e4m3": "f8e4m3"}
HF_CLASS = {"olmo2": "Olmo2RMSNorm", "llama": "LlamaRMSNorm"}


def torch_dtype(name):
    """The dtype a method is given and writes: fp8 inputs are dequantised into bf16."""
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
            "f8e4m3": torch.bfloat16}[name]


def draw_rows(tokens, width, gen, device):
    """The values before any rounding: float32 normal, rows scaled by 10^u (u in [-1, 1))."""
    mag = 10.0 ** (torch.rand(tokens, 1, generator=gen, device=device) * 2 - 1)
    x = torch.randn(tokens, width, generator=gen, device=device) * mag
    return torch.where(x == 0, torch.full_like(x, 1e-3), x)


def draw_weight(width, dtype, gen, device):
    return (torch.rand(width, generator=gen, device=device) * 1.75 + 0.25).to(dtype)


def quantise_e4m3(x):
    """Per-tensor scale amax / 448 in float32 and the saturating cast (clamped first: older torch
    casts past 448 to NaN). Returns the fp8 tensor and the scale."""
    scale = x.abs().max() / E4M3_MAX
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def inputs_of(dtype, x):
    """(what a method is given, the float64 values stored, the float64 values before
    quantisation or None when the inputs are not quantised)."""
    if dtype != "f8e4m3":
        given = x.to(torch_dtype(dtype))
        return given, given.double(), None
    x8, scale = quantise_e4m3(x)
    stored = x8.double() * scale.double()  # exact: 4 significant bits times a float32
    given = (x8.float() * scale).to(torch.bfloat16)
    return given, stored, x.double()


def gold(x64, w, eps):
    w64 = w.double()
    return w64 * x64 * (x64.square().mean(-1, keepdim=True) + eps).rsqrt()


def pooled_errors(pairs, suffix=""):
    """max abs, mean abs and RMSE of (got, gold) pairs pooled over all their elements."""
    n, total, squares, worst = 0, 0.0, 0.0, 0.0
    for got, ref in pairs:
        d = (got.detach().double() - ref).abs()
        n += d.numel()
        total += float(d.sum())
        squares += float(d.square().sum())
        worst = max(worst, float(d.max())) if d.numel() else worst
    n = max(n, 1)
    return {"max_abs_err" + suffix: worst, "mean_abs_err" + suffix: total / n,
            "rmse" + suffix: math.sqrt(squares / n)}


class _HfRMSNorm:
    """The forward of transformers' RMSNorm classes, for when transformers does not import: the
    float32 statistics and product, then the weight in each class's order."""

    def __init__(self, weight, eps):
        self.weight, self.variance_epsilon = weight, eps

    def normed(self, hidden_states):
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return hidden_states * torch.rsqrt(variance + self.variance_epsilon)


class _Olmo2RMSNorm(_HfRMSNorm):
    """Olmo2RMSNorm: the weight times the float32 product, rounded once."""

    def __call__(self, hidden_states):
        return (self.weight * self.normed(hidden_states)).to(hidden_states.dtype)


class _LlamaRMSNorm(_HfRMSNorm):
    """LlamaRMSNorm (OlmoeRMSNorm is the same code): rounded, then times the weight."""

    def __call__(self, hidden_states):
        return self.weight * self.normed(hidden_states).to(hidden_states.dtype)


REIMPLEMENTED = {"olmo2": _Olmo2RMSNorm, "llama": _LlamaRMSNorm}


def hf_classes(use_transformers=True):
    """({order: callable(weight, eps) -> norm}, what implements them)."""
    if use_transformers:
        try:
            import transformers
            from transformers.models.llama.modeling_llama import LlamaRMSNorm
            from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
        except Exception as e:  # not installed, or an install that does not import
            why = f"re-implementation (transformers does not import: {type(e).__name__})"
        else:
            def real(cls):
                def make(weight, eps):
                    # A bf16 model's module: its weight in the model dtype, as loaded.
                    norm = cls(weight.numel(), eps=eps).to(device=weight.device,
                                                           dtype=weight.dtype)
                    norm.requires_grad_(False)
                    norm.weight.copy_(weight)
                    return norm
                return make
            return ({"olmo2": real(Olmo2RMSNorm), "llama": real(LlamaRMSNorm)},
                    f"transformers {transformers.__version__}")
    else:
        why = "re-implementation (--no-transformers)"
    return REIMPLEMENTED, why


def standard_methods(hf, hf_impl):
    """{name: (callable(x, weight, eps, order) -> output, callable(order) -> its row's extra
    fields)}."""
    def torch_rms_norm(x, w, eps, order):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)

    def hf_rmsnorm(x, w, eps, order):
        return hf[order](w, eps)(x)

    return {"torch_rms_norm": (torch_rms_norm, lambda order: {}),
            "hf_rmsnorm": (hf_rmsnorm,
                           lambda order: {"hf_impl": hf_impl, "hf_class": HF_CLASS[order]})}


def study_config(model, tokens, dtype, device, seed, methods):
    """The rows of one (model, tokens, dtype): each method on the same inputs."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = torch_dtype(dtype)
    wq = draw_weight(model["q_width"], out, gen, device)
    wk = draw_weight(model["k_width"], out, gen, device)
    q = inputs_of(dtype, draw_rows(tokens, model["q_width"], gen, device))
    k = inputs_of(dtype, draw_rows(tokens, model["k_width"], gen, device))
    eps, order = model["eps"], model["order"]
    golds = (gold(q[1], wq, eps), gold(k[1], wk, eps))
    golds_e2e = (gold(q[2], wq, eps), gold(k[2], wk, eps)) if q[2] is not None else None
    rows = []
    for name, (norm, extra) in methods.items():
        with torch.no_grad():
            got = (norm(q[0], wq, eps, order), norm(k[0], wk, eps, order))
        row = {"method": name, "model": model["name"], "q_width": model["q_width"],
               "k_width": model["k_width"], "tokens": tokens, "dtype": dtype, "order": order,
               "eps": eps, "seed": seed, "out_dtype": str(got[0].dtype).replace("torch.", "")}
        row.update(pooled_errors(zip(got, golds)))
        if golds_e2e is not None:
            row.update(pooled_errors(zip(got, golds_e2e), "_e2e"))
        row.update(extra(order))
        rows.append(row)
    return rows


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="", help="comma-separated (default: bench/models.json)")
    ap.add_argument("--tokens", default="64,4096")
    ap.add_argument("--dtypes", default="bf16,fp8", help="bf16, f16, f32, fp8 (e4m3)")
    ap.add_argument("--device", default="auto", help="auto (CUDA if present), cuda or cpu")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--no-transformers", action="store_true",
                    help="use the re-implementation of the HF classes even if transformers imports")
    ap.add_argument("--json", default="", help="write the rows here")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        print("precision_study.py: PyTorch is not installed here; nothing to measure.")
        return 0
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    table = model_shapes.load()
    by_name = {m["name"]: m for m in table}
    names = [n for n in args.models.split(",") if n] or list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"precision_study.py: unknown models {unknown}; known: {list(by_name)}")
    try:
        dtypes = [DTYPE_ALIASES[d] for d in args.dtypes.split(",")]
    except KeyError as e:
        raise SystemExit(f"precision_study.py: unknown dtype {e}; known: {sorted(DTYPE_ALIASES)}")
    hf, hf_impl = hf_classes(not args.no_transformers)
    ms = standard_methods(hf, hf_impl)
    where = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"device {where}, torch {torch.__version__}, HF classes: {hf_impl}")
    rows = []
    for i, name in enumerate(names):
        for j, dtype in enumerate(dtypes):
            for t in (int(x) for x in args.tokens.split(",")):
                seed = args.seed * 1000003 + (i * 16 + j) * 65536 + t
                for r in study_config(by_name[name], t, dtype, device, seed, ms):
                    r.update(device=where, torch=torch.__version__)
                    rows.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\n".join(precision_table.table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
