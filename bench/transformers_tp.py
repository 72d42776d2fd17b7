"""transformers' own tensor parallelism against SwiftQK's, end to end, one process per GPU.

    torchrun --nproc-per-node N bench/transformers_tp.py --model olmo2-13b --layers 4 \\
        --batch 1,8,64 --json results/transformers_tp.json

Rank 0 writes a random-weight checkpoint of the model's real dimensions (bench/models.json;
nothing is downloaded) with --layers decoder layers and the model's own vocabulary to --workdir;
its norm weights are uniform in [0.5, 1.5], never ones, so a wrong slice of them shows. Every
rank then loads it with transformers' tp_plan="auto" twice in turn:

- "stock": the model as transformers' plan shards it. q/k/v_proj gather their outputs (the
  layerwise q_norm/k_norm need whole rows), so every rank runs the whole attention;
- each of --methods: the same load rewritten by swiftqk.integrations.transformers
  (apply_swiftqk_tp): each rank keeps its heads and the norm exchanges one fp32 partial sum of
  squares per token.

For each, at every batch size: the prefill of a --prompt-token prompt per sequence and the decode
TPOT over --steps greedy steps through the model's own KV cache (a DynamicCache, so eager, not
graph-captured), each the median of --iters timed repetitions after one warm-up; the weights'
GPU memory per rank and the peak while running; and the logits of the prompt and of the first
decode step against the stock model's. bf16 rounds every activation (2^-8), so two correct TP
layouts differ by rounding noise: a relative RMS difference of the logits up to AGREE_TOL counts
as agreement, where a wrong head, slice or weight is off by O(1). The run fails (exit 1) on any
disagreement.

--device cpu runs the same on CPU processes over gloo (fp32, the torch methods only, times
meaningless): the smoke test of this script (tests/python/test_transformers_tp_bench.py).
"""

import argparse
import inspect
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_shapes  # noqa: E402

# The model's own vocabulary, MLP and attention extras in transformers (models.json holds the
# attention and a dense-equivalent MLP width); "tiny" is a smoke-test shape that is no model.
VOCAB = {"olmo2-13b": 100352, "olmo3-32b": 100278, "olmoe": 50304, "tiny": 96}
AGREE_TOL = 0.05  # relative RMS difference of the logits, bf16 (fp32 on CPU: far below it)


def config_of(name, layers):
    import transformers

    if name == "tiny":
        hidden, heads, kv, hd, mlp, eps = 128, 8, 8, 16, 192, 1e-6
    else:
        hidden, heads, kv, hd, mlp, eps, _, _ = model_shapes.decoder_shapes()[name]
    common = dict(vocab_size=VOCAB[name], hidden_size=hidden, num_attention_heads=heads,
                  num_key_value_heads=kv, num_hidden_layers=layers, rms_norm_eps=eps,
                  max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)
    if hd * heads != hidden:
        common["head_dim"] = hd
    if name == "olmoe":
        # 64 experts of 1024, 8 a token (models.json's 8192 is the dense equivalent).
        return transformers.OlmoeConfig(**common, intermediate_size=1024, num_experts=64,
                                        num_experts_per_tok=8)
    if name == "olmo3-32b":
        # Three sliding-window layers to one full one, as OLMo 3 has them.
        types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
                 for i in range(layers)]
        return transformers.Olmo3Config(**common, intermediate_size=mlp, sliding_window=4096,
                                        layer_types=types)
    return transformers.Olmo2Config(**common, intermediate_size=mlp)


def write_checkpoint(name, layers, path, seed):
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_of(name, layers),
                                                          dtype=torch.bfloat16)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)


class Clock:
    """CUDA events on a GPU, the wall clock on CPU; milliseconds."""

    def __init__(self, cuda):
        self.cuda = cuda

    def time(self, fn):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b), out
        t = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t) * 1e3, out


def cache_kwarg(model):
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def cache_of(out):
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None)


@torch.no_grad()
def measure(model, prompt, steps, iters, clock):
    """(prefill ms, TPOT ms, logits of the prompt's last position and of the first step)."""
    kw = cache_kwarg(model)

    def prefill():
        return model(input_ids=prompt, use_cache=True)

    def decode(out):
        cache, logits = cache_of(out), out.logits[:, -1:]
        first = None
        for _ in range(steps):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            o = model(input_ids=nxt, use_cache=True, **{kw: cache})
            cache, logits = cache_of(o), o.logits
            first = o.logits if first is None else first
        return first

    out = prefill()  # warm-up
    first = decode(out)
    logits = torch.cat([out.logits[:, -1:], first], dim=1).float()
    pre, tpot = [], []
    for _ in range(iters):
        ms, out = clock.time(prefill)
        pre.append(ms)
        ms, _ = clock.time(lambda: decode(out))
        tpot.append(ms / steps)
    return statistics.median(pre), statistics.median(tpot), logits


def rel_rms(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).square().mean().sqrt() / ref.square().mean().sqrt()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="olmo2-13b", choices=["olmo2-13b", "olmo3-32b", "olmoe",
                                                             "tiny"])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the checkpoint")
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--steps", type=int, default=16, help="decode steps a TPOT is timed over")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--methods", default="swiftqk", help="apply_swiftqk_tp methods, comma "
                    "separated (swiftqk, minimax_fused, all_gather, minimax_eager)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--workdir", default="results/transformers_tp_ckpt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    ap.add_argument("--corrupt-norm", action="store_true",
                    help="the negative control of the agreement check: after the rewrite, double "
                    "rank 0's q-norm weight shard of the first layer, so the run must fail")
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    if args.layers < 1 or args.prompt < 1 or args.steps < 1 or args.iters < 1 or \
            min(batches) < 1:
        ap.error("--layers, --prompt, --steps, --iters and every --batch must be >= 1")

    cuda = args.device == "cuda"
    if not cuda:
        # transformers' tp_plan binds each rank to the accelerator it finds (cuda:LOCAL_RANK),
        # which fails on a machine with fewer GPUs than ranks: a CPU run hides the GPUs, before
        # anything initialises CUDA.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    from swiftqk.integrations.transformers import apply_swiftqk_tp, load_with_tp_plan

    dtype = torch.bfloat16 if cuda else torch.float32
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    path = os.path.join(args.workdir, f"{args.model}_l{args.layers}_s{args.seed}")
    if rank == 0 and not os.path.exists(os.path.join(path, "config.json")):
        write_checkpoint(args.model, args.layers, path, args.seed)
    dist.barrier()
    clock = Clock(cuda)
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompts = {b: torch.randint(3, VOCAB[args.model], (b, args.prompt), generator=gen).to(device)
               for b in batches}

    rows, stock_logits, failures = [], {}, []
    for variant in ["stock"] + methods:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        model = load_with_tp_plan(path, dtype).eval()
        if variant != "stock":
            model = apply_swiftqk_tp(model, method=variant)
            if args.corrupt_norm and rank == 0:
                with torch.no_grad():
                    model.model.layers[0].self_attn.swiftqk_qkv.norm.q_weight.mul_(2)
        weights_gib = torch.cuda.memory_allocated() / 2**30 if cuda else None
        for b in batches:
            pre, tpot, logits = measure(model, prompts[b], args.steps, args.iters, clock)
            row = dict(model=args.model, layers=args.layers, tp=world, variant=variant, batch=b,
                       prompt=args.prompt, steps=args.steps, prefill_ms=pre, tpot_ms=tpot,
                       weights_gib=weights_gib,
                       peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                       device=torch.cuda.get_device_name() if cuda else "cpu")
            if variant == "stock":
                stock_logits[b] = logits
            else:
                d = rel_rms(logits, stock_logits[b])
                same = (logits.argmax(-1) == stock_logits[b].argmax(-1)).float().mean().item()
                row.update(rel_rms_vs_stock=d, argmax_agree=same, agrees=d <= AGREE_TOL)
                if d > AGREE_TOL:
                    failures.append(f"{variant} batch {b}: relative RMS {d:.3e} > {AGREE_TOL}")
            rows.append(row)
        del model
    dist.barrier()
    if rank == 0:
        print(f"{args.model}, {args.layers} layers, TP {world}, {rows[0]['device']}, prompt "
              f"{args.prompt}, TPOT over {args.steps} steps, median of {args.iters}")
        print(f"{'variant':<14}{'batch':>6}{'prefill ms':>12}{'TPOT ms':>10}{'weights GiB':>13}"
              f"{'peak GiB':>10}{'rel RMS':>10}")
        def fmt(v, spec):
            return "-" if v is None else format(v, spec)

        for r in rows:
            print(f"{r['variant']:<14}{r['batch']:>6}{r['prefill_ms']:>12.3f}{r['tpot_ms']:>10.3f}"
                  f"{fmt(r['weights_gib'], '.2f'):>13}{fmt(r['peak_gib'], '.2f'):>10}"
                  f"{fmt(r.get('rel_rms_vs_stock'), '.2e'):>10}")
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        for msg in failures:
            print("DISAGREES:", msg)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
