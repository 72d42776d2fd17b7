"""The one table of model shapes, bench/models.json, for the Python benchmarks.

swiftqk_bench reads the same file through cmake/ModelShapes.cmake, which writes it into a header
at configure time; tests/python/test_model_shapes.py checks that every reader sees one table.
Needs only the standard library (no torch).
"""

import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models.json")
ORDERS = ("olmo2", "llama")
DECODER_KEYS = ("hidden", "heads", "kv_heads", "head_dim", "mlp_width", "layers")


def load(path=PATH):
    """The models in table order, each a dict (name, q_width, k_width, eps, order and, for the
    decode harness, decoder); raises ValueError naming what is wrong with an entry."""
    with open(path) as f:
        models = json.load(f)["models"]
    seen = set()
    for m in models:
        name = m.get("name")
        if not isinstance(name, str) or not name or name in seen:
            raise ValueError(f"{path}: model names must be distinct strings, got {name!r}")
        seen.add(name)
        for key in ("q_width", "k_width"):
            if not isinstance(m.get(key), int) or m[key] <= 0:
                raise ValueError(f"{path}: {name}.{key} must be a positive integer")
        if not isinstance(m.get("eps"), (int, float)) or not m["eps"] > 0:
            raise ValueError(f"{path}: {name}.eps must be a positive number")
        if m.get("order") not in ORDERS:
            raise ValueError(f"{path}: {name}.order must be one of {ORDERS}, "
                             f"got {m.get('order')!r}")
        d = m.get("decoder")
        if d is not None:
            if sorted(d) != sorted(DECODER_KEYS) or not all(isinstance(d[k], int) for k in d):
                raise ValueError(f"{path}: {name}.decoder needs integer {', '.join(DECODER_KEYS)}")
            if (d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]) != (m["q_width"],
                                                                             m["k_width"]):
                raise ValueError(f"{path}: {name}.decoder's heads x head_dim do not give its "
                                 "q_width and k_width")
    return models


def norm_shapes(path=PATH):
    """{name: (q width, k width, eps)} in table order."""
    return {m["name"]: (m["q_width"], m["k_width"], m["eps"]) for m in load(path)}


def decoder_shapes(path=PATH):
    """{name: (hidden, heads, kv heads, head_dim, MLP width, eps, norm order, layers)} for the
    models with a decoder entry, in table order."""
    out = {}
    for m in load(path):
        d = m.get("decoder")
        if d:
            out[m["name"]] = (d["hidden"], d["heads"], d["kv_heads"], d["head_dim"],
                              d["mlp_width"], m["eps"], m["order"], d["layers"])
    return out
