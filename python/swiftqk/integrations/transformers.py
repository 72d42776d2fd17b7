"""Head-sharded tensor parallelism for Hugging Face transformers' OLMo-family attention.

transformers' own TP plans for OLMo 2, OLMo 3, FlexOlmo and OLMoE (``config.base_model_tp_plan``;
the Olmo3-MoE remote code's attention is built the same way) shard q/k/v_proj by columns and then
gather their outputs
(``colwise_gather_output``: "we need to replicate here due to the added norm on q and k"): the
layerwise q_norm/k_norm need whole rows, so every rank runs the whole attention, and o_proj
splits its replicated input again (``rowwise_split_input``).

``apply_swiftqk_tp(model)`` keeps each rank's heads instead:

- q/k/v_proj become one column-parallel projection of this rank's query and KV heads (rank r of N
  holds heads [r*H/N, (r+1)*H/N) and KV heads [r*Hkv/N, (r+1)*Hkv/N); GQA needs N to divide
  Hkv, and each rank's query heads then use its own KV heads);
- q_norm/k_norm become ``swiftqk.TPQKNorm`` over those shards: one fp32 partial sum of squares
  per token and tensor is exchanged instead of the rows;
- RoPE, the KV cache and the attention kernel run on the local heads (the model's own code);
- o_proj becomes row-parallel: this rank's input columns, one all-reduce, then the bias once.

It works on a model loaded normally (every rank holds all weights) and on one loaded with
``tp_plan="auto"`` (its sharded DTensor weights are gathered once, then re-sliced by heads). Only
the attention changes: MLPs and experts stay as they were (replicated, or as transformers'
plan shards them).

The model's attention forward runs unchanged: the patched forward computes the sharded
projection and norm first, and hands the results to the stock forward through stand-ins for
q/k/v_proj (and identities for q/k_norm). So whatever the model's forward does around them
(RoPE, caches, sliding windows, attention backends, OlmoE's ``clip_qkv``) stays the model's own.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..distributed import FallbackCommunicator, communicator_from_group
from ..module import METHODS, TPQKNorm
from ..ops import FUSED_METHODS

# The attention classes whose forward projects its input with q_proj, k_proj and v_proj and
# normalises q and k with layerwise q_norm/k_norm over all heads (before or after projecting v),
# and the order of their RMSNorm: Olmo2RMSNorm and its copies multiply the weight in fp32 and
# round once; OlmoeRMSNorm rounds first (Llama's order). Olmo3MoeAttention is the Olmo3-MoE
# remote code (trust_remote_code, not in transformers itself, not tested here); its per-head
# norm option (use_head_qk_norm) needs no exchange and is refused.
ATTENTION_ORDERS = {
    "Olmo2Attention": "olmo2",
    "Olmo3Attention": "olmo2",
    "FlexOlmoAttention": "olmo2",
    "Olmo3MoeAttention": "olmo2",
    "OlmoeAttention": "llama",
}


@dataclass(frozen=True)
class AttentionLayout:
    """What apply_swiftqk_tp does to one attention module."""

    name: str  # the module's name in the model
    kind: str  # its class name
    order: str  # "olmo2" or "llama"
    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def _eps_of(norm) -> float:
    for attr in ("variance_epsilon", "eps"):
        if hasattr(norm, attr):
            return float(getattr(norm, attr))
    raise ValueError(f"{type(norm).__name__} has no variance_epsilon or eps")


def check_model(model: nn.Module, world_size: int) -> List[AttentionLayout]:
    """The attention layers apply_swiftqk_tp would shard over ``world_size`` ranks, or a
    ValueError saying why it cannot: no supported attention, heads or KV heads not divisible by
    the TP degree, a norm that is not layerwise, or a model it has already rewritten. Needs no
    process group; apply_swiftqk_tp calls it before it changes anything."""
    if world_size < 1:
        raise ValueError(f"the TP degree must be at least 1, got {world_size}")
    layouts = []
    for name, m in model.named_modules():
        kind = type(m).__name__
        if kind not in ATTENTION_ORDERS:
            continue
        if isinstance(getattr(m, "q_proj", None), _HandedProjection):
            raise ValueError(f"{name}: apply_swiftqk_tp has already sharded this model")
        d = int(m.head_dim)
        wq, wk = m.q_proj.out_features, m.k_proj.out_features
        heads, kv = wq // d, wk // d
        where = f"{name} ({kind})"
        if wq != heads * d or wk != kv * d or m.v_proj.out_features != wk or \
                m.o_proj.in_features != wq:
            raise ValueError(f"{where}: q/k/v/o_proj widths {wq}/{wk}/{m.v_proj.out_features}/"
                             f"{m.o_proj.in_features} do not fit {heads} x {kv} heads of {d}")
        nq, nk = m.q_norm.weight.shape[0], m.k_norm.weight.shape[0]
        if (nq, nk) != (wq, wk):
            raise ValueError(f"{where}: q_norm/k_norm are {nq}/{nk} wide, not the layerwise "
                             f"{wq}/{wk} (per-head norms need no exchange; SwiftQK handles "
                             "layerwise ones)")
        unknown = sorted(set(n for n, _ in m.named_parameters()) - set(_full_shapes(m)))
        if unknown:
            raise ValueError(f"{where}: parameters SwiftQK does not know how to shard: "
                             f"{', '.join(unknown)}")
        eps, k_eps = _eps_of(m.q_norm), _eps_of(m.k_norm)
        if eps != k_eps:
            raise ValueError(f"{where}: q_norm and k_norm have different eps ({eps}, {k_eps})")
        if heads % world_size or kv % world_size:
            raise ValueError(
                f"{where}: {heads} query heads and {kv} KV heads do not divide over TP "
                f"{world_size}; SwiftQK shards whole heads and needs the TP degree to divide "
                "both (replicated KV heads are not supported)")
        layouts.append(AttentionLayout(name, kind, ATTENTION_ORDERS[kind], heads, kv, d, eps))
    if not layouts:
        raise ValueError(
            f"{type(model).__name__} has no attention layer apply_swiftqk_tp knows: it shards "
            f"{', '.join(sorted(ATTENTION_ORDERS))} (OLMo 2, OLMo 3, FlexOlmo, Olmo3-MoE, OLMoE)")
    return layouts


def shard_weights(attn: nn.Module, rank: int, world_size: int,
                  full: Optional[Dict[str, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
    """This rank's weights of one attention module, as new tensors: ``qkv_weight`` [(Hq + 2 Hk)
    / N, hidden] (its query rows, then its key rows, then its value rows), ``qkv_bias`` or None,
    ``o_weight`` [hidden, Hq / N] (its input columns), ``o_bias`` (whole: added once, after the
    all-reduce) or None. ``full`` gives the unsharded tensors by parameter name
    (``q_proj.weight``, ...); by default they are the module's own, which must be whole."""
    if full is None:
        full = {n: p.detach() for n, p in attn.named_parameters()}
    wq = attn.q_proj.out_features // world_size
    wk = attn.k_proj.out_features // world_size
    wo = attn.o_proj.in_features // world_size

    def rows(name, n):
        return full[name][rank * n:(rank + 1) * n]

    out = {"qkv_weight": torch.cat([rows("q_proj.weight", wq), rows("k_proj.weight", wk),
                                    rows("v_proj.weight", wk)]),
           "o_weight": full["o_proj.weight"][:, rank * wo:(rank + 1) * wo].contiguous(),
           "qkv_bias": None, "o_bias": None}
    if "q_proj.bias" in full:
        out["qkv_bias"] = torch.cat([rows("q_proj.bias", wq), rows("k_proj.bias", wk),
                                     rows("v_proj.bias", wk)])
    if "o_proj.bias" in full:
        out["o_bias"] = full["o_proj.bias"].clone()
    if world_size == 1:  # the whole o_proj weight: a copy, so the model's tensor can go
        out["o_weight"] = out["o_weight"].clone()
    return out


class ShardedQKV(nn.Module):
    """One rank's query, key and value heads in one column-parallel projection, and SwiftQK's
    layerwise norm of its q and k shards (strided column views of the projection's output)."""

    def __init__(self, weight, bias, norm: TPQKNorm, widths):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.norm, self.widths = norm, tuple(widths)

    def forward(self, x):
        qkv = F.linear(x, self.weight, self.bias)
        q, k, v = torch.split(qkv, self.widths, dim=-1)
        lead = x.shape[:-1]
        # [T, w] views with the projection's row stride: what the fused kernel reads in place.
        qn, kn = self.norm(q.reshape(-1, self.widths[0]), k.reshape(-1, self.widths[1]))
        return qn.view(*lead, -1), kn.view(*lead, -1), v


class RowParallelLinear(nn.Module):
    """o_proj on this rank's input columns: a partial product, one all-reduce (sum) over the TP
    group, then the bias once."""

    def __init__(self, weight, bias, group, world_size):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group, self.world_size = group, world_size

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.world_size > 1:
            dist.all_reduce(y, group=self.group)
        return y if self.bias is None else y + self.bias


class _HandedProjection(nn.Module):
    """Stands in for q_proj, k_proj or v_proj inside the model's own attention forward: returns
    the tensor that the patched forward computed for this call and this input."""

    def __init__(self, which):
        super().__init__()
        self.which = which
        self._given = None

    def give(self, x, y):
        self._given = (x, y)

    def forward(self, x):
        given, self._given = self._given, None
        if given is None or given[0] is not x:
            raise RuntimeError(
                f"swiftqk: {self.which} was called outside the attention forward that "
                "apply_swiftqk_tp patched, or on another tensor than that forward's input; "
                "SwiftQK computes it with the norm, before the model's forward runs")
        return given[1]


def _patched_forward(attn, shard, stock_forward):
    handed = (attn.q_proj, attn.k_proj, attn.v_proj)

    def forward(*args, **kwargs):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        for proj, y in zip(handed, shard(x)):
            proj.give(x, y)
        try:
            return stock_forward(*args, **kwargs)
        finally:
            for proj in handed:
                proj._given = None

    return forward


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.4
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return False
    return isinstance(t, DTensor)


def _whole(t, full_shape, dim, group, world):
    """The unsharded tensor, whatever transformers' TP loading left on this rank: a DTensor is
    gathered (full_tensor), a plain tensor already whole is used as it is, and a plain shard of
    the full shape along ``dim`` (the local-tensor TP of older transformers) is all-gathered over
    the group in rank order."""
    if _is_dtensor(t):
        t = t.full_tensor()
    t = t.detach()
    if tuple(t.shape) == tuple(full_shape):
        return t
    shard = list(full_shape)
    shard[dim] //= world
    if world > 1 and tuple(t.shape) == tuple(shard):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts, dim)
    raise ValueError(f"a weight of shape {list(t.shape)} is neither the whole {list(full_shape)} "
                     f"nor a 1/{world} shard of it along dimension {dim}")


def _full_shapes(attn):
    """The unsharded shape of each parameter, from the modules' own sizes (a local shard's
    tensor shows only its part)."""
    shapes = {}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        lin = getattr(attn, n)
        shapes[f"{n}.weight"] = (lin.out_features, lin.in_features)
        shapes[f"{n}.bias"] = (lin.out_features,)
    shapes["q_norm.weight"] = (attn.q_proj.out_features,)
    shapes["k_norm.weight"] = (attn.k_proj.out_features,)
    return shapes


def _default_group(model, group, comm):
    if group is not None:
        return group
    if isinstance(comm, FallbackCommunicator):
        return comm.group
    if not (dist.is_available() and dist.is_initialized()):
        return None
    # A model loaded with tp_plan="auto" names its TP mesh; otherwise the default group.
    mesh = getattr(model, "_device_mesh", None)
    if mesh is None:
        mesh = getattr(model, "device_mesh", None)
    if mesh is not None:
        names = getattr(mesh, "mesh_dim_names", None) or ()
        if "tp" in names:
            return mesh.get_group("tp")
        if mesh.ndim == 1:
            return mesh.get_group()
    return dist.group.WORLD


def apply_swiftqk_tp(model: nn.Module, group=None, comm=None, method: str = "swiftqk",
                     enable_pdl: bool = False) -> nn.Module:
    """Shards every OLMo-family attention layer of ``model`` by heads over the TP group, with
    SwiftQK's norm on the local q/k shards; changes the model in place and returns it.

    Collective: every rank of the group calls it on the same model (same weights, or the same
    ``tp_plan="auto"`` load). Inference only (no autograd through the all-reduces).

    Args:
        group: the TP process group. Default: the model's TP mesh (``tp_plan="auto"``), else the
            default group if torch.distributed is initialized, else none (TP 1).
        comm: a swiftqk.Communicator or FallbackCommunicator for the fused methods. Default: one
            made here, ``create_local_group`` at TP 1 or ``communicator_from_group(group)``, on
            the model's CUDA device and shared by all layers.
        method: "swiftqk" (default) or "minimax_fused" (the fused CUDA op), or "all_gather" or
            "minimax_eager" (torch collectives; these also run on CPU).
        enable_pdl: launch the fused methods with programmatic dependent launch.

    Raises ValueError, before changing anything, for a model without a supported attention layer
    or with heads that do not divide over the TP degree (``check_model``), and for a fused method
    on a model that is not on a CUDA device.

    KV caches that size themselves from the first update (DynamicCache, the default) hold this
    rank's KV heads; a static cache sized from the config for all KV heads does not fit.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    group = _default_group(model, group, comm)
    if group is not None:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
    elif comm is not None:
        world, rank = comm.world_size, comm.rank
    else:
        world, rank = 1, 0
    if comm is not None and (comm.world_size, comm.rank) != (world, rank):
        raise ValueError(f"comm is rank {comm.rank} of {comm.world_size}, the group rank {rank} "
                         f"of {world}")
    layouts = check_model(model, world)
    if world > 1 and group is None:
        raise ValueError(f"TP {world} needs the process group of its ranks (group=...) for "
                         "o_proj's all-reduce")
    modules = dict(model.named_modules())
    fused = method in FUSED_METHODS
    device = modules[layouts[0].name].q_proj.weight.device
    if fused and device.type != "cuda":
        raise ValueError(f"method {method!r} runs the CUDA op, and the model is on {device}: use "
                         "method='minimax_eager' or 'all_gather' there")
    if fused and comm is None:
        from .. import create_local_group

        index = torch.cuda.current_device() if device.index is None else device.index
        comm = (create_local_group([index])[0] if world == 1
                else communicator_from_group(group, device=index))
    with torch.no_grad():
        for lay in layouts:
            attn = modules[lay.name]
            shapes = _full_shapes(attn)
            whole = {n: _whole(p, shapes[n], 1 if n == "o_proj.weight" else 0, group, world)
                     for n, p in attn.named_parameters()}
            w = shard_weights(attn, rank, world, whole)
            norm = TPQKNorm(whole["q_norm.weight"], whole["k_norm.weight"], lay.eps, lay.order,
                            comm if fused else None, method, group, enable_pdl)
            d = lay.head_dim
            widths = (lay.heads // world * d, lay.kv_heads // world * d,
                      lay.kv_heads // world * d)
            shard = ShardedQKV(w["qkv_weight"], w["qkv_bias"], norm, widths)
            stock_forward = attn.forward
            attn.swiftqk_qkv = shard
            attn.q_proj = _HandedProjection("q_proj")
            attn.k_proj = _HandedProjection("k_proj")
            attn.v_proj = _HandedProjection("v_proj")
            attn.q_norm, attn.k_norm = nn.Identity(), nn.Identity()
            attn.o_proj = RowParallelLinear(w["o_weight"], w["o_bias"], group, world)
            attn.forward = _patched_forward(attn, shard, stock_forward)
    return model


def load_with_tp_plan(path: str, dtype: torch.dtype):
    """Loads a checkpoint with transformers' own TP plan over the default process group:
    ``DistributedConfig(tp_plan="auto")`` where this transformers has it (``tp_plan=`` alone is
    deprecated there), else ``tp_plan="auto"``. Collective: every rank of the group calls it."""
    import inspect

    import transformers

    config = getattr(transformers, "DistributedConfig", None)
    if config is not None and "tp_plan" in inspect.signature(config).parameters:
        cfg = config(tp_plan="auto", tp_size=dist.get_world_size())
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                                 distributed_config=cfg)
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, tp_plan="auto")
