"""SwiftQK: layerwise QK-RMSNorm under tensor parallelism in one persistent CUDA kernel.

    import swiftqk
    comm = swiftqk.communicator_from_group(group)          # collective over the TP group
    norm = swiftqk.TPQKNorm(q_weight_full, k_weight_full, eps=1e-6, order="olmo2", comm=comm)
    q, k = norm(q_shard, k_shard)                           # views of a fused QKV output allowed

The op itself is ``torch.ops.swiftqk.qk_norm`` (schema-registered, mutates its two outputs, has a
Meta kernel): it works eagerly, under CUDA-graph capture and inside ``torch.compile``.
"""

import torch  # noqa: F401  (loads libtorch, which the extension links against)

from . import _C  # noqa: F401  (registers torch.ops.swiftqk and the communicator classes)
from ._C import Communicator, IpcBootstrap, create_local_group
from .distributed import FallbackCommunicator, communicator_from_group
from .module import METHODS, TPQKNorm
from .ops import ORDERS, qk_norm, qk_norm_

__all__ = [
    "Communicator",
    "FallbackCommunicator",
    "IpcBootstrap",
    "METHODS",
    "ORDERS",
    "TPQKNorm",
    "communicator_from_group",
    "create_local_group",
    "qk_norm",
    "qk_norm_",
]
