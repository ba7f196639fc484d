"""Loading libdcpx and declaring its C functions for ctypes.

The library is looked up, in this order:

1. ``$DCPX_LIBRARY``: a path to ``libdcpx.so`` (or its ``.so.0``);
2. a build tree of the source checkout this package sits in
   (``<checkout>/build*/libclient/.libs`` and ``<checkout>/libclient/.libs``),
   so that ``PYTHONPATH=python`` works straight after ``make``;
3. ``pkg-config --variable=libdir dcpx`` (an installed libdcpx);
4. the platform loader (``ctypes.util.find_library("dcpx")``, then
   ``libdcpx.so.0`` on the default search path).

If none works, :class:`LibraryNotFound` says how to build and install it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import subprocess
import threading
from ctypes import (POINTER, Structure, c_char_p, c_int, c_int32, c_int64,
                    c_size_t, c_uint16, c_uint32, c_uint64, c_void_p)
from typing import List, Optional, Tuple

__all__ = ["LibraryNotFound", "lib", "library_path", "DcpxShapeC",
           "DcpxJoinOptsC", "DcpxHealthInfoC", "DcpxRefStatsC", "DcpxCallC",
           "DcpxMergeOutC", "DcpxRefInC", "DcpxListsC", "DcpxDeviceC",
           "DcpxAsyncErrorC", "call_in",
           "merge_out"]


class LibraryNotFound(ImportError):
    """libdcpx could not be loaded (the message lists what was tried)."""


class DcpxShapeC(Structure):
    """``struct dcpx_shape``."""
    _fields_ = [("size", c_uint32), ("world", c_uint32), ("rows", c_uint32),
                ("topk", c_uint32), ("local_topk", c_uint32),
                ("block_size", c_uint32), ("interleave", c_uint32),
                ("max_local", c_uint32)]


class DcpxJoinOptsC(Structure):
    """``struct dcpx_join_opts``."""
    _fields_ = [("size", c_uint32), ("rank", c_uint32), ("group", c_char_p),
                ("device", c_int32), ("backend", c_uint32),
                ("transport", c_uint32), ("join_timeout_ms", c_uint32),
                ("timeout_ns", c_uint64)]


class DcpxHealthInfoC(Structure):
    """``struct dcpx_health_info``."""
    _fields_ = [("size", c_uint32), ("generation", c_uint32),
                ("abort", c_uint32), ("failed_mask", c_uint32),
                ("alarm_mask", c_uint32), ("joined_mask", c_uint32),
                ("world", c_uint32), ("rank", c_uint32),
                ("backend", c_uint32), ("transport", c_uint32),
                ("calls", c_uint64), ("rows", c_uint64),
                ("rescue_rows", c_uint64), ("failed_calls", c_uint64),
                ("daemon_link", c_uint32), ("reattaches", c_uint32)]


class DcpxRefStatsC(Structure):
    """``struct dcpx_ref_stats``."""
    _fields_ = [("rows", c_uint64), ("rescue_rows", c_uint64),
                ("saturated", c_uint64)]


class DcpxCallC(Structure):
    """``struct dcpx_call`` (v1): one call's inputs."""
    _fields_ = [("size", c_uint32), ("rows", c_uint32), ("stride", c_uint64),
                ("logits", c_void_p), ("row_ends", c_void_p),
                ("req_id", c_void_p), ("block_table", c_void_p),
                ("bt_rows", c_uint32), ("bt_cols", c_uint32),
                ("call_tag", c_uint64)]


class DcpxMergeOutC(Structure):
    """``struct dcpx_merge_out`` (v1): one call's outputs."""
    _fields_ = [("size", c_uint32), ("reserved", c_uint32),
                ("rows_out", c_void_p), ("valid_out", c_void_p),
                ("ids_out", c_void_p), ("sat_word", c_void_p)]


class DcpxRefInC(Structure):
    """``struct dcpx_ref_in`` (v1): a reference call's inputs."""
    _fields_ = [("size", c_uint32), ("rows", c_uint32), ("rank", c_uint32),
                ("reserved", c_uint32), ("stride", c_uint64),
                ("logits", c_void_p), ("row_ends", c_void_p),
                ("req_id", c_void_p), ("block_table", c_void_p),
                ("bt_rows", c_uint32), ("bt_cols", c_uint32),
                ("lists", c_void_p)]


class DcpxListsC(Structure):
    """``struct dcpx_lists`` (v1): lists an engine computed itself."""
    _fields_ = [("size", c_uint32), ("rows", c_uint32), ("n", c_uint32),
                ("flags", c_uint32), ("values", c_void_p),
                ("indices", c_void_p)]


class DcpxDeviceC(Structure):
    """``struct dcpx_device`` (v1): a member's device context, for an
    engine kernel that pushes itself (``include/dcpx/device.cuh``)."""
    _fields_ = [("size", c_uint32), ("world", c_uint32), ("rank", c_uint32),
                ("rows", c_uint32), ("local_topk", c_uint32),
                ("row_words", c_uint32), ("max_local", c_uint32),
                ("pdl", c_uint32), ("off_ll", c_uint64), ("peers", c_void_p),
                ("epoch", c_void_p), ("call_seq", c_void_p),
                ("stop", c_void_p), ("alarm", c_void_p),
                ("failed", c_void_p)]


class DcpxAsyncErrorC(Structure):
    """``struct dcpx_async_error`` (v1): a member's sticky error state."""
    _fields_ = [("size", c_uint32), ("state", c_int32), ("reason", c_uint32),
                ("abort", c_uint32), ("failed_mask", c_uint32),
                ("generation", c_uint32), ("rows", c_uint32),
                ("failed_rows", c_uint32), ("rows_exact", c_uint32),
                ("reserved", c_uint32), ("row_mask", c_uint64 * 64)]


def call_in(rows: int, logits: Optional[int], stride: int,
            row_ends: Optional[int], req_id: Optional[int] = None,
            block_table: Optional[int] = None, bt_rows: int = 0,
            bt_cols: int = 0, call_tag: int = 0) -> DcpxCallC:
    """A ``dcpx_call`` as ``DCPX_CALL_INIT`` and the fields (addresses)."""
    return DcpxCallC(ctypes.sizeof(DcpxCallC), rows, stride, logits,
                     row_ends, req_id, block_table, bt_rows, bt_cols,
                     call_tag)


def merge_out(rows_out: Optional[int], valid_out: Optional[int],
              ids_out: Optional[int] = None,
              sat_word: Optional[int] = None) -> DcpxMergeOutC:
    """A ``dcpx_merge_out`` as ``DCPX_MERGE_OUT_INIT`` and the fields."""
    return DcpxMergeOutC(ctypes.sizeof(DcpxMergeOutC), 0, rows_out,
                         valid_out, ids_out, sat_word)


# DCPX_STRUCT_* of include/dcpx.h: each mirrored struct, by kind, for
# dcpx_struct_size (python/tests/test_api.py checks every layout).
STRUCT_KINDS = {1: DcpxShapeC, 2: DcpxJoinOptsC, 3: DcpxHealthInfoC,
                4: DcpxRefStatsC, 5: DcpxCallC, 6: DcpxMergeOutC,
                7: DcpxRefInC, 8: DcpxAsyncErrorC, 9: DcpxListsC,
                10: DcpxDeviceC}

_P = c_void_p  # every buffer pointer is passed as a plain address

_PROTOS = {
    "dcpx_strerror": (c_char_p, [c_int]),
    "dcpx_version": (c_char_p, []),
    "dcpx_struct_size": (c_size_t, [c_uint32]),
    "dcpx_shape_check": (c_int, [POINTER(DcpxShapeC)]),
    "dcpx_shape_explain": (c_int, [POINTER(DcpxShapeC), c_char_p, c_size_t]),
    "dcpx_shape_auto_local_topk": (c_uint32, [c_uint32, c_uint32]),
    "dcpx_shape_warning": (c_char_p, [POINTER(DcpxShapeC)]),
    "dcpx_member_warning": (c_char_p, [c_void_p]),
    "dcpx_bf16_isnan": (c_int, [c_uint32]),
    "dcpx_ord16": (c_uint32, [c_uint32]),
    "dcpx_row_words": (c_uint32, [c_uint32]),
    "dcpx_word_encode": (c_int, [_P, c_uint32, c_uint32, c_uint32, c_uint32]),
    "dcpx_word_decode": (c_int, [_P, c_uint32, c_uint32, POINTER(c_uint32),
                                 POINTER(c_uint32)]),
    "dcpx_epoch_next": (c_uint32, [c_uint32]),
    "dcpx_epoch_tag": (c_uint32, [c_uint32]),
    "dcpx_epoch_pass": (c_uint32, [c_uint32, c_uint32]),
    "dcpx_gid": (c_int, [c_uint32, c_uint32, c_uint32, c_uint32,
                         POINTER(c_int64)]),
    "dcpx_ref_local_list": (c_int, [_P, c_uint32, c_uint32, _P]),
    "dcpx_ref_rescue_list": (c_int, [_P, c_uint32, c_uint32, c_uint32, _P]),
    "dcpx_ref_call": (c_int, [POINTER(DcpxShapeC), POINTER(DcpxRefInC),
                              POINTER(DcpxMergeOutC),
                              POINTER(DcpxRefStatsC)]),
    "dcpx_connect": (c_int, [c_char_p, POINTER(c_void_p)]),
    "dcpx_disconnect": (None, [c_void_p]),
    "dcpx_join": (c_int, [c_void_p, POINTER(DcpxShapeC),
                          POINTER(DcpxJoinOptsC), POINTER(c_void_p)]),
    "dcpx_client_last_error": (c_char_p, [c_void_p]),
    "dcpx_client_interrupt": (c_int, [c_void_p, c_int]),
    "dcpx_member_interrupt": (c_int, [c_void_p, c_int]),
    "dcpx_leave": (c_int, [c_void_p]),
    "dcpx_push": (c_int, [c_void_p, POINTER(DcpxCallC), c_void_p]),
    "dcpx_merge": (c_int, [c_void_p, POINTER(DcpxCallC),
                           POINTER(DcpxMergeOutC), c_void_p]),
    "dcpx_push_list": (c_int, [c_void_p, POINTER(DcpxCallC),
                               POINTER(DcpxListsC), c_void_p]),
    "dcpx_device_ctx": (c_int, [c_void_p, POINTER(DcpxDeviceC)]),
    "dcpx_health": (c_int, [c_void_p, POINTER(DcpxHealthInfoC)]),
    "dcpx_member_async_error": (c_int, [c_void_p, POINTER(DcpxAsyncErrorC)]),
    "dcpx_member_last_error": (c_char_p, [c_void_p]),
    "dcpx_poll": (c_int, [c_void_p]),
    "dcpx_recover": (c_int, [c_void_p, c_void_p, c_uint32]),
}

_HELP = (
    "libdcpx (the dcpx client library) was not found. Build and install it "
    "from the dcpx source tree:\n"
    "    ./autogen.sh && ./configure && make -j && sudo make install && "
    "sudo ldconfig\n"
    "or point DCPX_LIBRARY at a built one, e.g.\n"
    "    export DCPX_LIBRARY=<build>/libclient/.libs/libdcpx.so.0\n"
    "(<build>: the build folder; the source tree itself for an in-tree "
    "build)\n"
    "(shared libraries must be enabled: not configure --disable-shared).")


def _checkout(here: str) -> Tuple[Optional[str], Optional[str]]:
    """(root, None) for the dcpx source checkout this file lies in
    (ROOT/python/dcpx/_lib.py, with ROOT/configure.ac and
    ROOT/include/dcpx.h); (None, why) for a checkout that is not searched;
    (None, None) outside one. A package installed elsewhere (pip install
    --target DIR) is not in one, and a root that others may write (DIR =
    /tmp, a group-writable folder, one another user owns) is never taken:
    they could put a libdcpx there for this process to load."""
    pkg = os.path.dirname(here)
    if os.path.basename(pkg) != "dcpx" or \
            os.path.basename(os.path.dirname(pkg)) != "python":
        return None, None
    root = os.path.dirname(os.path.dirname(pkg))
    for marker in ("configure.ac", os.path.join("include", "dcpx.h")):
        if not os.path.isfile(os.path.join(root, marker)):
            return None, None
    try:  # not writable by others: owned by this user or root, 0o022 off
        st = os.stat(root)
    except OSError as e:
        return None, f"the source checkout {root} was not searched: {e}"
    if st.st_mode & 0o022 or st.st_uid not in (os.geteuid(), 0):
        return None, (
            f"the source checkout {root} was not searched: others may write "
            f"it (mode {st.st_mode & 0o777:04o}, owner uid {st.st_uid}), and "
            f"could plant a libdcpx there; chmod go-w it, or set "
            f"DCPX_LIBRARY to the library's path")
    return root, None


def _checkout_root(here: str) -> Optional[str]:
    """The source checkout this file lies in, if it is searched (_checkout)."""
    return _checkout(here)[0]


def _candidates() -> List[str]:
    out: List[str] = []
    env = os.environ.get("DCPX_LIBRARY")
    if env:
        return [env]  # an explicit choice is never second-guessed
    # A source checkout: python/dcpx/_lib.py -> the checkout's root.
    root = _checkout_root(os.path.abspath(__file__))
    if root:
        for d in sorted(glob.glob(os.path.join(root, "build*", "libclient",
                                               ".libs"))) + \
                [os.path.join(root, "libclient", ".libs")]:
            for name in ("libdcpx.so.0", "libdcpx.so", "libdcpx.dylib"):
                p = os.path.join(d, name)
                if os.path.exists(p):
                    out.append(p)
                    break
    try:
        libdir = subprocess.run(
            ["pkg-config", "--variable=libdir", "dcpx"], capture_output=True,
            text=True, timeout=10, check=False).stdout.strip()
        if libdir:
            for name in ("libdcpx.so.0", "libdcpx.so", "libdcpx.dylib"):
                p = os.path.join(libdir, name)
                if os.path.exists(p):
                    out.append(p)
                    break
    except (OSError, subprocess.SubprocessError):
        pass
    found = ctypes.util.find_library("dcpx")
    if found:
        out.append(found)
    out.append("libdcpx.so.0")
    return out


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def _declare(cdll: ctypes.CDLL) -> None:
    for name, (res, args) in _PROTOS.items():
        fn = getattr(cdll, name)
        fn.restype = res
        fn.argtypes = args


def lib() -> ctypes.CDLL:
    """The loaded libdcpx, with every public function declared.

    Raises :class:`LibraryNotFound` (an ``ImportError``) when it cannot be
    found or lacks a function of the API this package binds.
    """
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        # with DCPX_LIBRARY set the checkout is not searched anyway
        root, why = (None, None) if os.environ.get("DCPX_LIBRARY") else \
            _checkout(os.path.abspath(__file__))
        if why:
            tried.append(f"  ({why})")
        if root:  # what was looked in, where nothing was found
            tried.append(f"  (searched {root}/build*/libclient/.libs and "
                         f"{root}/libclient/.libs: a build folder of "
                         "another name is not searched)")
        for cand in _candidates():
            try:
                cdll = ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"  {cand}: {e}")
                continue
            try:
                _declare(cdll)
            except AttributeError as e:
                tried.append(f"  {cand}: not a matching libdcpx ({e})")
                continue
            from . import errors
            errors.remember_texts(cdll)
            _lib, _path = cdll, cand
            return cdll
        raise LibraryNotFound(_HELP + "\nTried:\n" + "\n".join(tried))


def library_path() -> str:
    """The path (or loader name) libdcpx was loaded from."""
    lib()
    assert _path is not None
    return _path


# Types re-exported for the other modules.
c_types = (c_int, c_int32, c_uint16, c_uint32, c_uint64, c_void_p)
