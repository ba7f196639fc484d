"""torch custom ops ``dcpx::push`` and ``dcpx::merge`` (torch >= 2.4).

Registered with ``torch.library.custom_op`` and fake implementations, so a
decode step that calls :meth:`dcpx.Member.push` / :meth:`dcpx.Member.merge`
can run under ``torch.compile(fullgraph=True)`` without graph breaks and be
captured in a CUDA graph (``torch.cuda.graph``). A member is named by its
``handle`` (an int). ``push`` returns a 0-element token tensor that
``merge`` takes, so the compiler keeps the two in order and never drops the
push. The real implementations check the arguments and call libdcpx on
``torch.cuda.current_stream()`` (CUDA backend) or the calling thread (host
backend); no host synchronization.

Importing this module imports torch; ``import dcpx`` registers the ops only
when torch is importable.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Tuple

import torch

from . import core as _core
from .core import MergeResult, Member, _member_by_handle
from .errors import (DeviceError, DtypeError, InvalidArgument, RangeError,
                     StateError)

__all__ = ["push", "merge", "REGISTERED"]

REGISTERED = hasattr(torch, "library") and hasattr(torch.library,
                                                   "custom_op")

if REGISTERED:
    @torch.library.custom_op("dcpx::push", mutates_args=())
    def _push(handle: int, logits: torch.Tensor, row_ends: torch.Tensor,
              call_tag: int) -> torch.Tensor:
        m = _member_by_handle(handle)
        m.push(logits, row_ends, call_tag=call_tag)
        return logits.new_empty((0,), dtype=torch.uint8)

    @_push.register_fake
    def _push_fake(handle: int, logits: torch.Tensor, row_ends: torch.Tensor,
                   call_tag: int) -> torch.Tensor:
        return logits.new_empty((0,), dtype=torch.uint8)

    # token: declared mutated (it is a 0-element tensor; nothing is
    # written): a mutating op is never dropped as dead code, by Inductor
    # either, whose elimination asks only that (see has_side_effect below)
    @torch.library.custom_op("dcpx::merge", mutates_args=("token",))
    def _merge(handle: int, logits: torch.Tensor, row_ends: torch.Tensor,
               req_id: torch.Tensor, block_table: torch.Tensor,
               token: torch.Tensor, want_ids: bool, want_sat: bool,
               call_tag: int) -> Tuple[torch.Tensor, torch.Tensor,
                                       torch.Tensor, torch.Tensor]:
        m = _member_by_handle(handle)
        r = m.merge(logits, row_ends, req_id, block_table, ids=want_ids,
                    sat=want_sat, call_tag=call_tag)
        none = logits.new_empty((0,), dtype=torch.int32)
        return (r.rows_out, r.valid_out,
                r.ids_out if r.ids_out is not None else none,
                r.sat_word if r.sat_word is not None else none.clone())

    @_merge.register_fake
    def _merge_fake(handle: int, logits: torch.Tensor,
                    row_ends: torch.Tensor, req_id: torch.Tensor,
                    block_table: torch.Tensor, token: torch.Tensor,
                    want_ids: bool, want_sat: bool, call_tag: int):
        K = _member_by_handle(handle)._topk
        rows = logits.shape[0]
        i32 = torch.int32
        return (logits.new_empty((rows, K), dtype=i32),
                logits.new_empty((rows,), dtype=i32),
                logits.new_empty((rows, K) if want_ids else (0,), dtype=i32),
                logits.new_empty((rows,) if want_sat else (0,), dtype=i32))

    @torch.library.custom_op(
        "dcpx::merge_out",
        mutates_args=("rows_out", "valid_out", "ids_out", "sat_word"))
    def _merge_out(handle: int, logits: torch.Tensor, row_ends: torch.Tensor,
                   req_id: torch.Tensor, block_table: torch.Tensor,
                   token: torch.Tensor, rows_out: torch.Tensor,
                   valid_out: torch.Tensor, ids_out: torch.Tensor,
                   sat_word: torch.Tensor, call_tag: int) -> None:
        m = _member_by_handle(handle)
        m.merge(logits, row_ends, req_id, block_table,
                out=MergeResult(rows_out, valid_out,
                                ids_out if ids_out.numel() else None,
                                sat_word if sat_word.numel() else None),
                call_tag=call_tag)

    @_merge_out.register_fake
    def _merge_out_fake(handle, logits, row_ends, req_id, block_table, token,
                        rows_out, valid_out, ids_out, sat_word,
                        call_tag) -> None:
        return None

    # Every op is a step of the group's protocol, whether or not its
    # outputs are used: a merge dropped as dead code (a warm-up step whose
    # result is thrown away) would leave its push pending and its peers
    # waiting. Side-effectful ops are never eliminated (FX's and
    # Inductor's dead-code elimination both ask).
    _side = getattr(getattr(torch.fx, "node", None), "has_side_effect", None)
    if _side is not None:
        for _op in (torch.ops.dcpx.push.default, torch.ops.dcpx.merge.default,
                    torch.ops.dcpx.merge_out.default):
            _side(_op)


_BF16 = tuple(getattr(torch, n) for n in ("bfloat16", "int16", "uint16")
              if hasattr(torch, n))
_I32 = (torch.int32,)
_U32 = tuple(getattr(torch, n) for n in ("int32", "uint32")
             if hasattr(torch, n))


def _tag64(call_tag: Any) -> int:
    """A call tag (any integer, modulo 2^64, as eager calls take it) as
    the ops' int64 argument: the same 64 bits, signed; the op's eager call
    takes it modulo 2^64 again. A tag that varies between calls of a
    compiled function is symbolic there (a SymInt, after at most one
    recompile): it goes to the op as it is, and must fit int64 (a step
    counter does)."""
    if (isinstance(call_tag, (int, torch.SymInt)) and
            not isinstance(call_tag, bool) and
            -(1 << 63) <= call_tag < (1 << 63)):
        return call_tag  # no bit operations: they fail on a SymInt
    t = _core._tag(call_tag)
    return t - (1 << 64) if t >> 63 else t


def _check_handle(m: Member) -> int:
    if m._ptr is None:
        raise StateError(context="the member has left its group")
    return m.handle


def _check(t: Any, name: str, dtypes: Tuple[Any, ...], ndim: int,
           m: Member, shape: Optional[Tuple[int, ...]] = None) -> None:
    """The checks of _arrays.check_array, written for Dynamo to trace
    (tensor attributes only)."""
    if not isinstance(t, torch.Tensor):
        raise DtypeError(context=f"{name} must be a torch tensor under "
                         "torch.compile")
    if t.dtype not in dtypes:
        raise DtypeError(context=f"{name} has the wrong dtype "
                         f"{t.dtype}; want one of {dtypes}")
    if m._cuda:
        if t.device.type != "cuda" or t.device.index != m._where_t[1]:
            raise DeviceError(context=f"{name} is on {t.device}, the member "
                              f"on cuda:{m._where_t[1]}")
    elif t.device.type != "cpu":
        raise DeviceError(context=f"{name} is on {t.device}, but the member "
                          "uses the host backend")
    if t.dim() != ndim:
        raise InvalidArgument(context=f"{name} must be {ndim}-D")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise InvalidArgument(context=f"{name} must have shape {shape}")
    if not t.is_contiguous():
        raise InvalidArgument(context=f"{name} must be contiguous")


def _check_rows(m: Member, logits: Any, row_ends: Any) -> int:
    _check(logits, "logits", _BF16, 2, m)
    rows = logits.shape[0]
    _check(row_ends, "row_ends", _I32, 1, m, (rows,))
    if rows > m._rows:
        raise RangeError(context=f"{rows} rows, more than the group's "
                         f"rows={m._rows}")
    return rows


if REGISTERED:
    _core._torch_ops = sys.modules[__name__]
    _core._is_compiling = getattr(getattr(torch, "compiler", None),
                                  "is_compiling", None) or \
        torch._dynamo.is_compiling


def push(m: Member, logits: torch.Tensor, row_ends: torch.Tensor,
         call_tag: int = 0) -> torch.Tensor:
    """``torch.ops.dcpx.push``: checks the arguments (traceable), then the
    op. Returns the token for :func:`merge`."""
    if not REGISTERED:
        raise RuntimeError("dcpx torch ops need torch >= 2.4 "
                           "(torch.library.custom_op)")
    _check_rows(m, logits, row_ends)
    return torch.ops.dcpx.push(_check_handle(m), logits, row_ends,
                               _tag64(call_tag))


def merge(m: Member, logits: torch.Tensor, row_ends: torch.Tensor,
          req_id: torch.Tensor, block_table: torch.Tensor,
          out: Optional[Sequence[Any]] = None, ids: bool = True,
          sat: bool = False, call_tag: int = 0,
          token: Optional[torch.Tensor] = None) -> MergeResult:
    """``torch.ops.dcpx.merge`` (or ``merge_out`` with ``out``); ``ids``
    and ``sat`` are bools (as :meth:`Member.merge`)."""
    if not REGISTERED:
        raise RuntimeError("dcpx torch ops need torch >= 2.4 "
                           "(torch.library.custom_op)")
    ids = _core._flag(ids, "merge: ids")
    sat = _core._flag(sat, "merge: sat")
    rows = _check_rows(m, logits, row_ends)
    _check(req_id, "req_id", _I32, 1, m, (rows,))
    _check(block_table, "block_table", _I32, 2, m)
    if token is None:
        token = logits.new_empty((0,), dtype=torch.uint8)
    h = _check_handle(m)
    if out is not None:
        K = m._topk
        if not isinstance(out, (tuple, list)) or not 2 <= len(out) <= 4:
            raise InvalidArgument(context="out must be (rows_out, valid_out"
                                  "[, ids_out[, sat_word]]) (as eager)")
        o = MergeResult(*out)
        _check(o.rows_out, "out.rows_out", _I32, 2, m, (rows, K))
        _check(o.valid_out, "out.valid_out", _I32, 1, m, (rows,))
        if o.ids_out is not None:
            _check(o.ids_out, "out.ids_out", _I32, 2, m, (rows, K))
        if o.sat_word is not None:
            _check(o.sat_word, "out.sat_word", _U32, 1, m, (rows,))
        none = logits.new_empty((0,), dtype=torch.int32)
        torch.ops.dcpx.merge_out(
            h, logits, row_ends, req_id, block_table, token, o.rows_out,
            o.valid_out, o.ids_out if o.ids_out is not None else none,
            o.sat_word if o.sat_word is not None else none,
            _tag64(call_tag))
        return o
    r, v, i, s = torch.ops.dcpx.merge(h, logits, row_ends, req_id,
                                      block_table, token, bool(ids),
                                      bool(sat), _tag64(call_tag))
    return MergeResult(r, v, i if ids else None, s if sat else None)
