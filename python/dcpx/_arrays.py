"""Array adapters: numpy arrays and torch tensors, checked and pointed at.

torch is never imported here: a tensor is recognised only when the caller
has imported torch already.
"""

from __future__ import annotations

import operator
import sys
from typing import Any, Optional, Sequence, Tuple

from .errors import DeviceError, DtypeError, InvalidArgument

BF16 = "bf16"   # bf16 bit patterns: 2-byte integers or bfloat16
I32 = "int32"
U32 = "uint32"  # sat_word: uint32 (numpy) or int32 (torch, or numpy)

_NP_OK = {BF16: ("uint16", "int16", "bfloat16"), I32: ("int32",),
          U32: ("uint32", "int32")}
_TORCH_OK = {BF16: ("bfloat16", "int16", "uint16"), I32: ("int32",),
             U32: ("int32", "uint32")}
#: The element size of each kind: every array of a call is aligned to it
#: (include/dcpx.h: "aligned to their element"). The CUDA backend's
#: launchers refuse a misaligned one, which fails the rank, with a vague
#: reason ("not enqueued: a NULL or misaligned array ..."); the host
#: backend reads it through int32 and uint16 pointers unchecked.
_ALIGN = {BF16: 2, I32: 4, U32: 4}
_HINT = {BF16: "bf16 bit patterns: a numpy uint16/int16 array "
               "(dcpx.to_bf16_bits(x) converts floats) or a torch "
               "bfloat16/int16 tensor",
         I32: "int32", U32: "uint32 (numpy) or int32"}


def _torch():
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    """True for a torch.Tensor (only when torch is already imported)."""
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def not_int(x: Any) -> bool:
    """True for what dcpx does not take as an integer: no ``__index__``,
    or a bool, Python's or numpy's (``np.True_`` has ``__index__`` and
    became rank 1)."""
    return isinstance(x, bool) or not hasattr(x, "__index__") or \
        getattr(getattr(x, "dtype", None), "kind", None) == "b"


def is_numpy(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def compiling() -> bool:
    """True while torch.compile (Dynamo) traces."""
    t = _torch()
    if t is None:
        return False
    comp = getattr(t, "compiler", None)
    if comp is not None and hasattr(comp, "is_compiling"):
        return bool(comp.is_compiling())
    dyn = getattr(t, "_dynamo", None)
    return bool(dyn is not None and dyn.is_compiling())


def _dtype_name(x: Any) -> str:
    if is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return getattr(getattr(x, "dtype", None), "name", type(x).__name__)


def shape_of(x: Any) -> Tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


_TD: Optional[dict] = None
_STRIDED: Any = None  # torch.strided, once torch is imported


def _torch_dtypes() -> dict:
    """{kind: frozenset of torch dtypes}, built once torch is imported."""
    global _TD, _STRIDED
    if _TD is None:
        t = _torch()
        _STRIDED = t.strided
        _TD = {k: frozenset(getattr(t, n) for n in names if hasattr(t, n))
               for k, names in _TORCH_OK.items()}
    return _TD


def _not_dense(x: Any, name: str) -> None:
    """Refuses a tensor that is not dense (sparse, nested, mkldnn): it has
    no one C-contiguous block of memory (some raised RuntimeError from
    is_contiguous(), some passed as not contiguous)."""
    raise InvalidArgument(context=f"{name} must be a dense tensor, got "
                          f"{'a nested' if x.is_nested else x.layout} "
                          "tensor (use .to_dense(), or "
                          ".to_padded_tensor(0) for a nested one)")


def _masked(x: Any, name: str) -> None:
    """Refuses a numpy masked array: libdcpx reads (and writes) every
    element and never sees the mask, so masked entries took part."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ma.MaskedArray):
        raise InvalidArgument(context=f"{name} is a numpy masked array: "
                              "libdcpx reads every element and never sees "
                              "the mask (pass x.filled(value), or "
                              "np.asarray(x) for the data as it is)")


def _check_tensor(x: Any, name: str, kind: str, ndim: int,
                  where: Tuple[str, int],
                  shape: Optional[Tuple[int, ...]]) -> None:
    # The call path: tensor attributes only, no string formatting unless
    # the check fails (a few microseconds for all of a merge's arrays).
    if x.dtype not in _torch_dtypes()[kind]:
        raise DtypeError(context=f"{name} must be {_HINT[kind]}, got "
                         f"{x.dtype}")
    if x.layout is not _STRIDED or x.is_nested:
        _not_dense(x, name)
    dev = x.get_device()  # -1 on the CPU
    if where[0] == "cpu":
        if dev != -1 or not x.is_cpu:
            raise DeviceError(context=f"{name} is on {x.device}, but the "
                              "member uses the host backend (CPU tensors "
                              "or numpy)")
    elif dev != where[1] or not x.is_cuda:
        raise DeviceError(context=f"{name} is on {x.device}, but the "
                          f"member uses the CUDA backend on "
                          f"cuda:{where[1]}")
    if x.dim() != ndim:
        raise InvalidArgument(context=f"{name} must be {ndim}-D, got shape "
                              f"{shape_of(x)}")
    if shape is not None and x.shape != shape:
        raise InvalidArgument(context=f"{name} must have shape "
                              f"{tuple(shape)}, got {shape_of(x)}")
    if not x.is_contiguous():
        raise InvalidArgument(context=f"{name} must be C-contiguous (use "
                              ".contiguous())")
    if x.data_ptr() % _ALIGN[kind] and x.numel():
        raise InvalidArgument(context=_misaligned(name, kind, x.data_ptr(),
                                                  ".clone()"))


def _misaligned(name: str, kind: str, addr: int, fix: str) -> str:
    n = _ALIGN[kind]
    return (f"{name} must be aligned to its {n}-byte element (libdcpx "
            f"reads it as such), but its data starts at {addr:#x}, "
            f"{addr % n} byte(s) past: copy it ({fix})")


_NP_SEEN: dict = {}


def _np_dtype_ok(dt: Any, kind: str) -> bool:
    """Whether numpy dtype dt is one of kind's, native and of its size;
    remembered per (dtype, kind): numpy's dtype.name takes microseconds,
    and an engine passes the same few dtypes on every call."""
    ok = _NP_SEEN.get((dt, kind))
    if ok is None:
        ok = (dt.name in _NP_OK[kind] and dt.isnative and
              dt.itemsize == (2 if kind == BF16 else 4))
        if len(_NP_SEEN) < 256:
            _NP_SEEN[(dt, kind)] = ok
    return ok


def check_array(x: Any, name: str, kind: str, ndim: int,
                where: Tuple[str, int],
                shape: Optional[Tuple[int, ...]] = None,
                writable: bool = False) -> None:
    """Refuses (DtypeError, DeviceError, InvalidArgument) an array that is
    not of ``kind``, not ``ndim``-dimensional (and of ``shape``), not
    C-contiguous, or not on ``where`` (("cpu", -1) or ("cuda", index))."""
    t = _torch()
    if t is not None and isinstance(x, t.Tensor):
        return _check_tensor(x, name, kind, ndim, where, shape)
    if is_numpy(x):
        if type(x) is not sys.modules["numpy"].ndarray:
            _masked(x, name)  # subclasses: np.matrix, memmap are fine
        if not _np_dtype_ok(x.dtype, kind):
            raise DtypeError(context=f"{name} must be {_HINT[kind]}, got "
                             f"numpy {x.dtype}")
        if where[0] != "cpu":
            raise DeviceError(context=f"{name} is a numpy array, but the "
                              f"member uses the CUDA backend on "
                              f"cuda:{where[1]}: pass torch CUDA tensors")
        flags = x.flags
        contiguous = bool(flags.c_contiguous)
        aligned = bool(flags.aligned) or not x.size
        if writable and not flags.writeable:
            raise InvalidArgument(context=f"{name} is read-only")
    else:
        raise DtypeError(context=f"{name} must be a numpy array or a torch "
                         f"tensor, got {type(x).__name__}")
    if len(x.shape) != ndim:
        raise InvalidArgument(context=f"{name} must be {ndim}-D, got shape "
                              f"{shape_of(x)}")
    if shape is not None and shape_of(x) != tuple(shape):
        raise InvalidArgument(context=f"{name} must have shape "
                              f"{tuple(shape)}, got {shape_of(x)}")
    if not contiguous:
        raise InvalidArgument(context=f"{name} must be C-contiguous (use "
                              ".contiguous() / np.ascontiguousarray)")
    if not aligned:
        raise InvalidArgument(context=_misaligned(name, kind, x.ctypes.data,
                                                  "x.copy()"))


#: What an empty torch tensor passes (its data_ptr() is 0, which libdcpx
#: refuses as a missing array): any non-NULL address, never read, since an
#: empty array has nothing to read (a zero-row call).
_EMPTY_ADDR = 16


def ptr(x: Any) -> Optional[int]:
    """The data address of an array, or None for None."""
    if x is None:
        return None
    data_ptr = getattr(x, "data_ptr", None)  # torch
    if data_ptr is not None:
        p = data_ptr()
        return p if p or x.numel() else _EMPTY_ADDR
    return x.ctypes.data  # numpy


#: What PreparedCall compares on every call (see watch): per torch tensor
#: (its bound data_ptr, that address, the tensor, its shape, its bound
#: is_contiguous, its name); per numpy array (the array, its shape, its
#: strides, whether it is an output, its name).
Watch = Tuple[Tuple[Tuple[Any, ...], ...], Tuple[Tuple[Any, ...], ...]]


def watch(arrays: Sequence[Tuple[str, Any]],
          outputs: Sequence[Tuple[str, Any]] = ()) -> Watch:
    """What :func:`moved` compares: the address, shape and layout of each
    (name, checked array or None) as they are now; of each of
    ``outputs`` also that it is still writable (numpy's writeable flag)."""
    tw, nw = [], []
    for out, named in ((False, arrays), (True, outputs)):
        for name, x in named:
            if x is None:
                continue
            if is_torch(x):
                tw.append((x.data_ptr, x.data_ptr(), x, x.shape,
                           x.is_contiguous, name))
            else:
                nw.append((x, x.shape, x.strides, x.base, out, name))
    return tuple(tw), tuple(nw)


def moved(w: Watch) -> Optional[str]:
    """The name of the first watched array that no longer has the address,
    shape and layout :func:`watch` saw (a torch tensor ``resize_``d,
    ``set_`` to other storage, ``as_strided_``, its storage resized; a
    numpy array reshaped or ``resize``d in place, or given another
    buffer with ``.data =``, which replaces its ``base``), or a numpy output
    made read-only since (``flags.writeable = False``), else None. The
    call path: about 0.2 us a torch tensor, 0.1 us a numpy array. A numpy
    array's address is not read (``.ctypes.data`` costs 0.5 us): it moves
    only when ``resize(refcheck=False)`` changes its size, and so its
    shape (numpy refuses a plain ``resize`` of an array that a
    PreparedCall holds), so only a resize and a resize back between two
    calls goes unseen, as does ``resize(refcheck=False)`` of the array a
    bound view looks into (which leaves numpy's own view dangling)."""
    for dp, p, x, s, contiguous, name in w[0]:
        if dp() != p or x.shape != s or not contiguous():
            return name
    for x, s, st, base, out, name in w[1]:
        if x.shape != s or x.strides != st or x.base is not base or \
                (out and not x.flags.writeable):
            return name
    return None


def read_only(x: Any) -> bool:
    """True for a numpy array that may not be written (torch tensors have
    no such flag)."""
    return is_numpy(x) and not x.flags.writeable


def _extent(x: Any) -> Tuple[int, int]:
    """[start, end) of a checked (C-contiguous) array's bytes."""
    data_ptr = getattr(x, "data_ptr", None)  # torch
    if data_ptr is not None:
        p = data_ptr()
        return p, p + x.numel() * x.element_size()
    p = x.ctypes.data
    return p, p + x.nbytes


def check_no_overlap(outputs: Sequence[Tuple[str, Any]],
                     inputs: Sequence[Tuple[str, Any]]) -> None:
    """Refuses (InvalidArgument) output arrays whose bytes overlap one
    another or an input's: the library writes each output while it reads
    the inputs and writes the others, so a shared buffer gives a silently
    wrong result. Arrays are (name, array or None), already checked."""
    def spans(arrays: Sequence[Tuple[str, Any]]) -> list:
        s = [(n, _extent(x)) for n, x in arrays if x is not None]
        return [(n, e) for n, e in s if e[1] > e[0]]  # empty: no bytes
    outs = spans(outputs)
    every = outs + spans(inputs)
    for i, (name, (a0, a1)) in enumerate(outs):
        for other, (b0, b1) in every[i + 1:]:
            if a0 < b1 and b0 < a1:
                raise InvalidArgument(context=f"{name} overlaps {other} "
                                      "(each output needs memory of its "
                                      "own)")


def empty(like: Any, shape: Tuple[int, ...], kind: str) -> Any:
    """An uninitialised output of ``kind`` beside ``like``."""
    if is_torch(like):
        t = _torch()
        return t.empty(shape, dtype=t.int32, device=like.device)
    import numpy as np
    return np.empty(shape, np.uint32 if kind == U32 else np.int32)


def stream_handle(s: Any) -> Optional[int]:
    """A cudaStream_t as an int from an int (numpy's too), a
    torch.cuda.Stream or anything with ``cuda_stream``. A bool, or an
    int outside 0..2^64-1 (ctypes took 2^64 as 0, the legacy default
    stream, and -1 as 2^64-1), raises InvalidArgument."""
    if s is None:
        return None
    if type(s) is int:
        h = s
    elif hasattr(s, "__index__") and not_int(s):
        raise InvalidArgument(context=f"stream must be an int handle or a "
                              f"torch.cuda.Stream, got bool {s!r}")
    elif hasattr(s, "__index__"):
        h = operator.index(s)
    else:
        h = getattr(s, "cuda_stream", None)
        if not_int(h):
            raise InvalidArgument(context=f"stream must be an int handle "
                                  f"or a torch.cuda.Stream, got "
                                  f"{type(s).__name__}")
        h = operator.index(h)
    if not 0 <= h <= 0xFFFFFFFFFFFFFFFF:
        raise InvalidArgument(context=f"stream handle {h} is outside "
                              "0..2^64-1: not a cudaStream_t")
    return h


def current_stream(x: Any) -> Optional[int]:
    """torch.cuda.current_stream() of the tensor's device (no sync)."""
    t = _torch()
    if t is None or not is_torch(x):
        return None
    return int(t.cuda.current_stream(x.device).cuda_stream)


_raw_stream: Any = None


def current_stream_of_device(device: int) -> Optional[int]:
    """torch's current CUDA stream of ``device`` as a cudaStream_t int
    (the capture stream inside torch.cuda.graph); no sync."""
    global _raw_stream
    if _raw_stream is None:
        t = _torch()
        if t is None:
            return None
        raw = getattr(t._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw if raw is not None else \
            (lambda d: t.cuda.current_stream(d).cuda_stream)
    return int(_raw_stream(device))


def to_numpy_host(x: Any, name: str, kind: str, ndim: int) -> Any:
    """A C-contiguous numpy view (or copy) of a host array of ``kind``."""
    import numpy as np
    _masked(x, name)  # np.asarray drops the mask
    if is_torch(x):
        _torch_dtypes()
        if x.layout is not _STRIDED or x.is_nested:
            _not_dense(x, name)
        if x.device.type != "cpu":
            x = x.cpu()
        if _dtype_name(x) == "bfloat16":
            x = x.view(_torch().int16)
        x = x.contiguous().numpy()
    # a C-contiguous, aligned copy of what is neither (np.require: a
    # misaligned array stays misaligned through np.ascontiguousarray)
    x = np.require(np.asarray(x), requirements="CA")
    check_array(x, name, kind, ndim, ("cpu", -1))
    if kind == BF16 and x.dtype.name == "bfloat16":
        x = x.view(np.uint16)
    return x


def to_bf16_bits(x: Any) -> Any:
    """float array -> its bf16 bit patterns (numpy uint16), rounded to
    nearest even; NaN stays NaN. Wider floats go through float32 first,
    as torch's .to(torch.bfloat16) does, and a value beyond float32's
    range becomes an infinity without numpy's overflow warning."""
    import numpy as np
    try:
        a = np.asarray(x)
        # numpy would read a string as the number it spells, None as NaN
        # and a complex number as its real part: none is a real number
        if a.dtype.kind in "cmMSUV" or (a.dtype.kind == "O" and any(
                v is None or isinstance(v, (str, bytes, complex))
                for v in a.flat)):
            raise TypeError(f"got {a.dtype.name} elements")
        with np.errstate(over="ignore"):
            f = np.ascontiguousarray(a, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(
            context=f"to_bf16_bits: numbers expected ({e})") from None
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def from_bf16_bits(b: Any) -> Any:
    """bf16 bit patterns (integers 0..0xFFFF, any integer dtype, or a
    list of them) -> float32 numpy array of the same shape."""
    import numpy as np
    a = np.asarray(b)
    if a.dtype == np.uint16 or a.dtype == np.int16:
        a = a.view(np.uint16)  # the bit patterns themselves
    elif a.dtype.kind in "iu" or (a.size == 0 and a.dtype.kind == "f"):
        if a.size and (a.min() < 0 or a.max() > 0xFFFF):
            raise InvalidArgument(
                context="from_bf16_bits: bit patterns must be 0..0xFFFF")
        a = a.astype(np.uint16)
    else:
        raise InvalidArgument(context=f"from_bf16_bits: integers expected, "
                                      f"got dtype {a.dtype}")
    return (np.ascontiguousarray(a).astype(np.uint32) << 16).view(np.float32)
