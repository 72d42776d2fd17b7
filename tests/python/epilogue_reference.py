"""Float64 reference of the fused QK epilogue and its tolerances, in torch: the Python twin of
tests/support/epilogue_reference.cpp (the gold) and of check_epilogue_rank's bounds
(tests/support/epilogue_problem.cpp)."""

import torch

from reference import ABSOLUTE_FLOOR, UNIT_ROUNDOFF

E4M3_MAX = 448.0


def rope_table(max_position, rotary_dim, dtype=torch.float32, base=10000.0):
    """A real rotary table [max_position, rotary_dim]: the cos half, then the sin half of each
    row (vLLM's cos_sin_cache), frequencies base^(-2i / rotary_dim)."""
    half = rotary_dim // 2
    inv = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / rotary_dim)
    f = torch.arange(max_position, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([f.cos(), f.sin()], dim=-1).to(dtype)


def rotation_pairs(rotary_dim, is_neox):
    """Index tensors (a, b) of the pairs a rotation mixes within a head: NeoX (i, i + R/2),
    GPT-J (2i, 2i + 1), for i < R/2."""
    i = torch.arange(rotary_dim // 2)
    return (i, i + rotary_dim // 2) if is_neox else (2 * i, 2 * i + 1)


def partner_index(head_dim, rotary_dim, is_neox):
    """[head_dim]: the element each element is rotated with (itself past rotary_dim)."""
    idx = torch.arange(head_dim)
    a, b = rotation_pairs(rotary_dim, is_neox)
    idx[a], idx[b] = b, a
    return idx


def norm_rope_fp64(x, w, positions, cos_sin, head_dim, rotary_dim, is_neox=True, headwise=False,
                   weight_plus_one=False, eps=1e-6):
    """The gold, in float64 with no rounding: y = w * x / sqrt(mean(x^2) + eps) (w -> 1 + w with
    weight_plus_one), the mean over the whole row (layerwise: pass the FULL rows of all ranks) or
    each head, then every head rotated by the cos/sin row of its token's position. x [T, H*D]
    -> float64 [T, H*D] on the CPU."""
    x64 = x.detach().double().cpu()
    w64 = w.detach().double().cpu()
    if weight_plus_one:
        w64 = 1.0 + w64
    t = x64.shape[0]
    heads = x64.shape[1] // head_dim
    if headwise:
        xh = x64.view(t, heads, head_dim)
        y = w64 * xh * torch.rsqrt(xh.square().mean(-1, keepdim=True) + eps)
    else:
        y = (w64 * x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)).view(
            t, heads, head_dim)
    cs = cos_sin.detach().double().cpu()[positions.cpu()]  # [T, rotary_dim]
    half = rotary_dim // 2
    c, s = cs[:, None, :half], cs[:, None, half:]
    a, b = rotation_pairs(rotary_dim, is_neox)
    ya, yb = y[..., a], y[..., b]
    out = y.clone()
    out[..., a] = ya * c - yb * s
    out[..., b] = yb * c + ya * s
    return out.reshape(t, heads * head_dim)


def e4m3_tolerance(gold):
    """One e4m3 ulp at |gold| (2^-9 below 2^-6), plus |gold| - 448 past saturation
    (epilogue_reference.cpp's e4m3_tolerance, elementwise)."""
    a = gold.abs()
    m = a.clamp(max=E4M3_MAX)
    _, e = torch.frexp(m)  # m = mantissa * 2^e, mantissa in [0.5, 1): ilogb(m) = e - 1
    e = torch.where(m < 2.0**-6, torch.full_like(e, -6), e - 1)
    return torch.ldexp(torch.ones_like(a), e - 3) + (a - E4M3_MAX).clamp(min=0)


def quantize_e4m3(x, scale):
    """What an fp8 cache stores for x: float32 x / scale, saturated to +-448, rounded to nearest
    even (torch's conversion overflows to NaN instead of saturating, hence the clamp)."""
    return (x.float() / scale.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def epilogue_bound(gold, model_dtype, order, head_dim, rotary_dim, is_neox):
    """check_epilogue_rank's bound on |got - gold| for a model-dtype output: the order's
    roundings (1.25 u Olmo2, 2.25 u Llama, + 1e-5) relative to the pair the element was rotated
    with (an input error of y = a c -+ b s reaches y as |a| + |b| at most), times 1.5."""
    rel = (1.25 if order == "olmo2" else 2.25) * UNIT_ROUNDOFF[model_dtype] + 1e-5
    t, width = gold.shape
    g = gold.view(t, width // head_dim, head_dim)
    partner = g[..., partner_index(head_dim, rotary_dim, is_neox)]
    rotated = torch.arange(head_dim) < rotary_dim
    pair = g.abs() + torch.where(rotated, partner.abs(), torch.zeros_like(partner))
    return (1.5 * rel * pair.clamp(min=ABSOLUTE_FLOOR[model_dtype])).view(t, width)


def count_epilogue_wrong(got, gold, model_dtype, order, head_dim, rotary_dim, is_neox,
                         scale=None):
    """Elements of got (model dtype, or float8_e4m3fn with its scale tensor) outside the bound
    around gold (float64 [T, W]); NaN or inf counts as wrong. Rows of gold that are NaN (tokens
    that must not be written) are skipped here: check them on their own."""
    bound = epilogue_bound(gold, model_dtype, order, head_dim, rotary_dim, is_neox)
    g = got.detach().double().cpu()
    if scale is not None:
        s = float(scale.item())
        g = g * s
        bound = bound + s * e4m3_tolerance(gold / s)
    keep = ~torch.isnan(gold)
    bad = ~((g - gold).abs() <= bound) & keep
    return int(bad.sum())


def cache_rows(cache, slots, layout, block_size):
    """The [len(slots), kv_heads * head_dim] rows a cache holds at ``slots`` (each >= 0)."""
    blocks, offsets = slots // block_size, slots % block_size
    rows = cache[blocks, offsets] if layout == "NHD" else cache[blocks, :, offsets]
    return rows.reshape(len(slots), -1)


def cache_slot_mask(cache, slots, layout, block_size):
    """A bool tensor shaped like cache, True at every element of the given slots."""
    mask = torch.zeros(cache.shape, dtype=torch.bool, device=cache.device)
    blocks, offsets = slots // block_size, slots % block_size
    if layout == "NHD":
        mask[blocks, offsets] = True
    else:
        mask[blocks, :, offsets] = True
    return mask
