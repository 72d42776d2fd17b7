"""SwiftQK: layerwise QK-RMSNorm under tensor parallelism in one persistent CUDA kernel.

    import swiftqk
    comm = swiftqk.communicator_from_group(group)          # collective over the TP group
    norm = swiftqk.TPQKNorm(q_weight_full, k_weight_full, eps=1e-6, order="olmo2", comm=comm)
    q, k = norm(q_shard, k_shard)                           # views of a fused QKV output allowed

The op itself is ``torch.ops.swiftqk.qk_norm`` (schema-registered, mutates its two outputs, has a
fake kernel that checks shapes, dtypes and devices): it works eagerly, under CUDA-graph capture
and inside ``torch.compile``. ``swiftqk.qk_epilogue`` (``torch.ops.swiftqk.qk_epilogue``) fuses
the norm with RoPE and the write of K and V into a paged KV cache (``PagedKVCache``), fp8 too.
"""

from ._version import __version__

try:
    import torch  # noqa: F401  (loads libtorch, which the extension links against)
except ModuleNotFoundError as e:
    raise ImportError("swiftqk needs PyTorch, which is not installed here.") from e

from ._extension import load as _load

_C = _load()  # registers torch.ops.swiftqk and the communicator classes

from ._C import Communicator, IpcBootstrap, create_local_group  # noqa: E402
from .distributed import FallbackCommunicator, communicator_from_group  # noqa: E402
from .module import METHODS, REFERENCE_METHODS, TPQKNorm  # noqa: E402
from .ops import FUSED_METHODS, ORDERS, qk_norm, qk_norm_  # noqa: E402
from .epilogue_ops import KV_LAYOUTS, qk_epilogue  # noqa: E402
from .paged_kv_cache import PagedKVCache  # noqa: E402

__all__ = [
    "Communicator",
    "FUSED_METHODS",
    "FallbackCommunicator",
    "IpcBootstrap",
    "KV_LAYOUTS",
    "METHODS",
    "ORDERS",
    "PagedKVCache",
    "REFERENCE_METHODS",
    "TPQKNorm",
    "__version__",
    "communicator_from_group",
    "create_local_group",
    "qk_epilogue",
    "qk_norm",
    "qk_norm_",
]
