"""dcpx: exact top-K merge across the GPUs of a decode-context-parallel
group, from Python (numpy, and PyTorch with custom ops, CUDA graphs and
torch.compile).

    import dcpx
    shape = dcpx.Shape(world=8, rows=64, topk=2048, local_topk=0,
                       block_size=64, interleave=1, max_local=16384)
    with dcpx.Client() as c, c.join(shape, rank=r, group="dsa") as m:
        m.push(logits, row_ends)            # [rows][len] bf16, [rows] int32
        out = m.merge(logits, row_ends, req_id, block_table)
        out.rows_out, out.valid_out, out.ids_out

libdcpx is loaded on first use ($DCPX_LIBRARY, a build tree, pkg-config,
the platform loader); :func:`load` loads it now. When torch is installed,
``import dcpx`` imports it and registers the custom ops dcpx::push and
dcpx::merge (DCPX_NO_TORCH=1 skips that). See README.md, "Python".
"""

from __future__ import annotations

from ._arrays import from_bf16_bits, to_bf16_bits
from ._lib import LibraryNotFound, library_path
from ._lib import lib as load
from .core import (DEFAULT_SOCKET, GROUP_NAME_MAX, MAX_LOCAL, MAX_ROWS,
                   MAX_TOPK, MAX_WORLD, AsyncError, Backend, Client, Health,
                   JoinOptions, Reason,
                   Member, MergeResult, PreparedCall, RefStats,
                   Shape, Transport,
                   auto_local_topk, connect, ref_call, ref_local_list,
                   strerror, version)
from .errors import *  # noqa: F401,F403  (the exception classes)
from .errors import ERRORS, DcpxError, error_for

__version__ = "0.1.0"

__all__ = ["AsyncError", "Backend", "Client", "Health", "JoinOptions",
           "Member", "Reason",
           "PreparedCall",
           "MergeResult", "RefStats", "Shape", "Transport", "connect",
           "auto_local_topk", "ref_call", "ref_local_list", "strerror",
           "version", "load", "library_path", "LibraryNotFound",
           "to_bf16_bits", "from_bf16_bits", "DcpxError", "ERRORS",
           "error_for", "torch_ops_available", "DEFAULT_SOCKET",
           "GROUP_NAME_MAX", "MAX_LOCAL", "MAX_ROWS", "MAX_TOPK",
           "MAX_WORLD"]
from . import errors as _errors  # noqa: E402
__all__ += [n for n in _errors.__all__ if n not in __all__]


def _register_torch_ops() -> bool:
    import os
    if os.environ.get("DCPX_NO_TORCH"):  # numpy only: skip importing torch
        return False
    try:
        import torch  # noqa: F401  (imported first, then the ops)
    except Exception:  # torch absent or broken: numpy-only
        return False
    try:
        from . import torch_ops
    except Exception:
        return False
    return torch_ops.REGISTERED


#: True when the torch custom ops dcpx::push / dcpx::merge are registered.
torch_ops_available: bool = _register_torch_ops()
