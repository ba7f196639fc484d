"""Rank processes of test_gpu.py (spawned: CUDA does not survive fork)."""

import ctypes
import os
import time
import traceback

import numpy as np

import dcpx
from _ranks import compare, inputs, tables


BARRIER = None


def _join(rank, sock, group, shape, ngpu, transport=dcpx.Transport.AUTO,
          timeout_ns=5_000_000_000):
    import torch
    dev = rank % ngpu
    torch.cuda.set_device(dev)
    c = dcpx.Client(sock)
    m = c.join(shape, rank=rank, group=group, backend=dcpx.Backend.CUDA,
               device=dev, timeout_ns=timeout_ns, transport=transport)
    return c, m, torch.device("cuda", dev)


def _leave(c, m):
    """Leaves once every rank is done: nobody leaves while a peer still
    merges."""
    BARRIER.wait(120)
    m.leave()
    c.close()


def _host(res):
    return dcpx.MergeResult(*[None if x is None else x.cpu().numpy()
                              for x in res])


def rank_main(mode, rank, q, barrier, sock, group, shape, ngpu, calls):
    global BARRIER
    BARRIER = barrier
    try:
        q.put(("ok", rank, globals()["run_" + mode](
            rank, sock, group, shape, ngpu, calls)))
    except BaseException:  # noqa: BLE001
        q.put(("err", rank, traceback.format_exc()))


def _t(x, d, bf16=False):
    import torch
    t = torch.from_numpy(np.ascontiguousarray(x))
    if bf16:
        t = t.view(torch.int16).view(torch.bfloat16) if t.dtype == \
            torch.uint16 else t.view(torch.bfloat16)
    return t.to(d)


def _lg(x, d):
    import torch
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)) \
        .view(torch.bfloat16).to(d)


def run_eager(rank, sock, group, shape, ngpu, calls):
    import torch
    c, m, d = _join(rank, sock, group, shape, ngpu)
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    for call in range(calls):
        lg, en = inputs(31, call, shape.world, R, L,
                        ("random", "ties", "skew")[call % 3])
        x, e = _lg(lg[rank], d), _t(en[rank], d)
        m.push(x, e, call_tag=call)
        res = m.merge(x, e, req_t, bt_t, sat=True, call_tag=call)
        assert res.rows_out.is_cuda and res.rows_out.device == d
        compare(_host(res), dcpx.ref_call(shape, lg, en, rank, req, bt), R)
    # wrong device / dtype: refused before any work
    for bad, cls in ((x.cpu(), dcpx.DeviceError),
                     (lg[rank], dcpx.DeviceError),
                     (x.float(), dcpx.DtypeError)):
        try:
            m.push(bad, e)
        except cls:
            pass
        else:
            raise AssertionError(f"{cls.__name__} not raised")
    torch.cuda.synchronize()
    assert m.health().calls >= 0
    _leave(c, m)
    return calls


def run_empty(rank, sock, group, shape, ngpu, calls):
    """Empty calls (rows 0) with NULL for every array, straight through
    the C API on the CUDA backend: dcpx_push, dcpx_merge and
    dcpx_push_list (no lists at all, and lists with no arrays) return 0
    and fail nobody, and the calls after them are exact."""
    import torch
    from dcpx._lib import DcpxCallC, DcpxListsC, DcpxMergeOutC
    c, m, d = _join(rank, sock, group, shape, ngpu,
                    transport=dcpx.Transport.LL)
    R, L = shape.rows, shape.max_local
    N = shape.local_topk or dcpx.auto_local_topk(shape.world, shape.topk)
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    cin = DcpxCallC()
    cin.size = ctypes.sizeof(DcpxCallC)
    out = DcpxMergeOutC()
    out.size = ctypes.sizeof(DcpxMergeOutC)
    li = DcpxListsC(ctypes.sizeof(DcpxListsC), 0, N, 0, None, None)
    st = m._stream(None)
    for call in range(calls):
        for push in ((m._lib.dcpx_push, ctypes.byref(cin)),
                     (m._lib.dcpx_push_list, ctypes.byref(cin), None),
                     (m._lib.dcpx_push_list, ctypes.byref(cin),
                      ctypes.byref(li))):
            r = m._call(push[0], *push[1:], st)
            assert r == 0, f"empty push: {dcpx.strerror(r)}"
            r = m._call(m._lib.dcpx_merge, ctypes.byref(cin),
                        ctypes.byref(out), st)
            assert r == 0, f"empty merge: {dcpx.strerror(r)}"
        lg, en = inputs(37, call, shape.world, R, L, "random")
        _exact_call(m, shape, rank, d, call, lg, en, (req, bt, req_t, bt_t))
    torch.cuda.synchronize()
    _leave(c, m)
    return calls


def _exact_call(m, shape, rank, d, call, lg, en, tabs):
    """Push and merge of call `call` on rank's rows of lg, en (tabs: the
    host and device request and block tables), equal to the reference."""
    req, bt, req_t, bt_t = tabs
    x, e = _lg(lg[rank], d), _t(en[rank], d)
    m.push(x, e, call_tag=call)
    res = m.merge(x, e, req_t, bt_t, sat=True, call_tag=call)
    compare(_host(res), dcpx.ref_call(shape, lg, en, rank, req, bt),
            shape.rows)


def _top_lists(lg, en, N):
    """The local top-N of every row as push_list takes it (the
    reference's own lists: ties to the lower index)."""
    rows = lg.shape[0]
    vals = np.zeros((rows, N), np.uint16)
    idx = np.full((rows, N), -1, np.int32)
    for t in range(rows):
        for j, (_, l) in enumerate(dcpx.ref_local_list(lg[t, :en[t]], N)):
            vals[t, j], idx[t, j] = lg[t, l], l
    return vals, idx


def _torch_lists(lg, N):
    """torch.topk's lists of full rows (on the CPU, so that every rank
    computes every rank's lists alike), indices sorted ascending."""
    import torch
    x = torch.from_numpy(dcpx.from_bf16_bits(lg))
    _, i = torch.topk(x, N, dim=1)
    i, _ = i.sort(dim=1)
    v = torch.from_numpy(lg.view(np.int16)).gather(1, i)
    return v.numpy().view(np.uint16).copy(), i.int().numpy().copy()


def run_push_list(rank, sock, group, shape, ngpu, calls):
    """Member.push_list with CUDA tensors: the reference's top-N lists
    (even calls) against the logits' result, torch.topk's lists of full
    rows (odd calls) against the result exact for those lists."""
    import torch
    c, m, d = _join(rank, sock, group, shape, ngpu)
    R, L, N = shape.rows, shape.max_local, m.shape.local_topk
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    for call in range(calls):
        lg, en = inputs(61, call, shape.world, R, L,
                        ("random", "skew")[call // 2 % 2])
        if call % 2:
            en = [np.full(R, L, np.int32) for _ in en]
            lists = [_torch_lists(x, N) for x in lg]
        else:
            lists = [_top_lists(x, e, N) for x, e in zip(lg, en)]
        x, e = _lg(lg[rank], d), _t(en[rank], d)
        v, i = lists[rank]
        m.push_list(_lg(v, d), _t(i, d), e, check_order=True, call_tag=call)
        res = m.merge(x, e, req_t, bt_t, sat=True, call_tag=call)
        compare(_host(res), dcpx.ref_call(shape, lg, en, rank, req, bt,
                                          lists=lists if call % 2 else None),
                R)
    torch.cuda.synchronize()
    assert m.health().ok
    _leave(c, m)
    return calls


def run_push_list_nccl(rank, sock, group, shape, ngpu, calls):
    """push_list on the NCCL transport: NotSupported, nothing done, the
    rank not failed (it used to mark itself FAILED and abort the group);
    dcpx_push then works and is exact."""
    import torch
    c, m, d = _join(rank, sock, group, shape, ngpu, dcpx.Transport.NCCL)
    R, L, N = shape.rows, shape.max_local, m.shape.local_topk
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    for call in range(calls):
        lg, en = inputs(67, call, shape.world, R, L, "random")
        x, e = _lg(lg[rank], d), _t(en[rank], d)
        v, i = _top_lists(lg[rank], en[rank], N)
        try:
            m.push_list(_lg(v, d), _t(i, d), e, call_tag=call)
        except dcpx.NotSupported:
            pass
        else:
            raise AssertionError("push_list on nccl: NotSupported not raised")
        assert m.health().ok, "push_list on nccl failed the rank"
        m.push(x, e, call_tag=call)
        res = m.merge(x, e, req_t, bt_t, sat=True, call_tag=call)
        compare(_host(res), dcpx.ref_call(shape, lg, en, rank, req, bt), R)
    torch.cuda.synchronize()
    assert m.health().ok
    _leave(c, m)
    return calls


def run_other_device(rank, sock, group, shape, ngpu, calls):
    """The member's GPU is not the calling thread's current one (the
    engine's thread sits on another GPU), and the calls use that GPU's
    default (legacy) stream: every call still runs on the member's GPU,
    exact, and the thread's current device stays as the caller set it
    (the kernels used to go to the current GPU, where nothing is
    mapped)."""
    import torch
    dev, other = (rank + 1) % ngpu, rank % ngpu
    torch.cuda.set_device(dev)
    c = dcpx.Client(sock)
    m = c.join(shape, rank=rank, group=group, backend=dcpx.Backend.CUDA,
               device=dev, timeout_ns=5_000_000_000)
    d = torch.device("cuda", dev)
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    torch.cuda.set_device(other)
    for call in range(calls):
        lg, en = inputs(71, call, shape.world, R, L, "random")
        x, e = _lg(lg[rank], d), _t(en[rank], d)
        m.push(x, e, call_tag=call)
        res = m.merge(x, e, req_t, bt_t, sat=True, call_tag=call)
        assert torch.cuda.current_device() == other
        compare(_host(res), dcpx.ref_call(shape, lg, en, rank, req, bt), R)
    torch.cuda.synchronize(d)
    assert m.health().ok
    _leave(c, m)
    return calls


class _AllocProp(ctypes.Structure):
    """CUmemAllocationProp (cuda.h), for _vmm_half_mapped."""
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


def _vmm_half_mapped(dev):
    """(address, bytes): the first `bytes` of a reservation twice that size
    are device memory of GPU dev, the rest is reserved and not mapped; an
    array that runs past `bytes` runs into memory no kernel may touch.
    (The driver API through ctypes; torch made the context current.)"""
    c = ctypes
    cu = c.CDLL("libcuda.so.1")

    def ck(r, what):
        assert r == 0, f"{what}: CUresult {r}"

    prop = _AllocProp(1, 0, 1, dev)  # PINNED, no handle, on device dev
    g = c.c_size_t()
    ck(cu.cuMemGetAllocationGranularity(c.byref(g), c.byref(prop), 0),
       "cuMemGetAllocationGranularity")
    ptr, h = c.c_uint64(), c.c_uint64()
    ck(cu.cuMemAddressReserve(c.byref(ptr), c.c_size_t(2 * g.value),
                              c.c_size_t(0), c.c_uint64(0), c.c_uint64(0)),
       "cuMemAddressReserve")
    ck(cu.cuMemCreate(c.byref(h), g, c.byref(prop), c.c_uint64(0)),
       "cuMemCreate")
    ck(cu.cuMemMap(ptr, g, c.c_size_t(0), h, c.c_uint64(0)), "cuMemMap")
    desc = (c.c_int * 3)(1, dev, 3)  # CUmemAccessDesc: device dev, RW
    ck(cu.cuMemSetAccess(ptr, g, c.byref(desc), c.c_size_t(1)),
       "cuMemSetAccess")
    return ptr.value, g.value


def run_bad_arrays(rank, sock, group, shape, ngpu, calls):
    """A C caller's arrays that no kernel of the member's GPU may touch are
    refused before anything is enqueued (DCPX_E_INVAL, the reason in the
    log), the engine's CUDA context stays healthy, and after dcpx_recover
    the calls are exact: logits in host memory from malloc; rows_out whose
    last bytes run into reserved, unmapped space; with two GPUs, logits
    on the other GPU. valid_out in page-locked host memory is accepted."""
    import torch
    from dcpx._lib import call_in, merge_out
    c, m, d = _join(rank, sock, group, shape, ngpu)
    R, L, K = shape.rows, shape.max_local, shape.topk
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    lg, en = inputs(5, 0, shape.world, R, L, "random")
    x, e = _lg(lg[rank], d), _t(en[rank], d)
    ref = dcpx.ref_call(shape, lg, en, rank, req, bt)
    st = ctypes.c_void_p(torch.cuda.current_stream(d).cuda_stream)
    inval = dcpx.InvalidArgument.code

    def push(logits_ptr):
        cin = call_in(R, logits_ptr, L, e.data_ptr())
        return m._call(m._lib.dcpx_push, ctypes.byref(cin), st)

    def merge(rows_out, valid_out, ids_out):
        cin = call_in(R, x.data_ptr(), L, e.data_ptr(), req_t.data_ptr(),
                      bt_t.data_ptr(), bt.shape[0], bt.shape[1])
        cout = merge_out(rows_out, valid_out, ids_out)
        return m._call(m._lib.dcpx_merge, ctypes.byref(cin),
                       ctypes.byref(cout), st)

    def refused(r, what):
        assert r == inval, f"{what}: {r}, not DCPX_E_INVAL"
        torch.cuda.synchronize(d)  # raises if a kernel had faulted
        m.recover(timeout_ms=20000)

    rows_out = torch.empty((R, K), dtype=torch.int32, device=d)
    ids_out = torch.empty((R, K), dtype=torch.int32, device=d)
    valid_out = torch.empty((R,), dtype=torch.int32, device=d)
    host = np.ascontiguousarray(lg[rank])
    pageable = ctypes.c_int(0)  # CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS
    ctypes.CDLL("libcuda.so.1").cuDeviceGetAttribute(
        ctypes.byref(pageable), 88, d.index)
    if not pageable.value:  # else the GPU reads malloc'd memory: let through
        refused(push(host.ctypes.data), "logits from malloc")
    if ngpu >= 2:
        other = _lg(lg[rank], torch.device("cuda", (d.index + 1) % ngpu))
        refused(push(other.data_ptr()), "logits on another GPU")
    base, nb = _vmm_half_mapped(d.index)
    short = base + nb - (R * K * 4 - 64)  # 64 bytes short of the call's
    assert push(x.data_ptr()) == 0
    refused(merge(short, valid_out.data_ptr(), ids_out.data_ptr()),
            "rows_out past its mapping")
    pinned = torch.empty((R,), dtype=torch.int32, pin_memory=True)
    for call in range(2):
        assert push(x.data_ptr()) == 0
        r = merge(rows_out.data_ptr(),
                  pinned.data_ptr() if call else valid_out.data_ptr(),
                  ids_out.data_ptr())
        assert r == 0, f"merge: {r}"
        torch.cuda.synchronize(d)
        got = dcpx.MergeResult(rows_out.cpu().numpy(),
                               (pinned if call else valid_out).cpu().numpy(),
                               ids_out.cpu().numpy(), None)
        compare(got, ref, R)
    _leave(c, m)
    return calls


def run_stride_nocheck(rank, sock, group, shape, ngpu, calls):
    """DCPX_PTR_CHECK=0 turns off the driver's view of the arrays only: a
    stride whose rows run past the end of the address space is still
    refused (InvalidArgument) before a launch; it was enqueued, and the
    kernel read a wrapped address (a fault that ends the context). The
    calls after recovery are exact."""
    import torch
    from dcpx._lib import call_in
    os.environ["DCPX_PTR_CHECK"] = "0"  # read at the join
    c, m, d = _join(rank, sock, group, shape, ngpu)
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    lg, en = inputs(6, 0, shape.world, R, L, "random")
    x, e = _lg(lg[rank], d), _t(en[rank], d)
    st = ctypes.c_void_p(torch.cuda.current_stream(d).cuda_stream)
    for stride in (1 << 62, (1 << 64) // 2 // max(R - 1, 1)):
        cin = call_in(R, x.data_ptr(), stride, e.data_ptr())
        r = m._call(m._lib.dcpx_push, ctypes.byref(cin), st)
        assert r == dcpx.InvalidArgument.code, f"stride {stride}: {r}"
        torch.cuda.synchronize(d)  # raises if a kernel had faulted
        m.recover(timeout_ms=20000)
    tabs = (req, bt, _t(req, d), _t(bt, d))
    for call in range(calls):
        _exact_call(m, shape, rank, d, call, lg, en, tabs)
    torch.cuda.synchronize()
    _leave(c, m)
    return calls


def _static_buffers(rank, shape, d):
    """A graph's static buffers on device d: the tables (host and device),
    the logits and row ends, and the outputs."""
    import torch
    R, L, K = shape.rows, shape.max_local, shape.topk
    req, bt = tables(rank, R, L, shape.block_size)
    i32 = torch.int32
    x = torch.zeros((R, L), dtype=torch.bfloat16, device=d)
    e = torch.zeros(R, dtype=i32, device=d)
    out = dcpx.MergeResult(torch.empty((R, K), dtype=i32, device=d),
                           torch.empty(R, dtype=i32, device=d),
                           torch.empty((R, K), dtype=i32, device=d),
                           torch.empty(R, dtype=i32, device=d))
    return req, bt, _t(req, d), _t(bt, d), x, e, out


def run_graph(rank, sock, group, shape, ngpu, calls):
    """push + merge captured once in a CUDA graph, replayed per call with
    new inputs copied into the static buffers."""
    import torch
    c, m, d = _join(rank, sock, group, shape, ngpu)
    R, L = shape.rows, shape.max_local
    req, bt, req_t, bt_t, x, e, out = _static_buffers(rank, shape, d)

    def load(call):
        lg, en = inputs(41, call, shape.world, R, L,
                        ("random", "ties", "skew")[call % 3])
        x.copy_(_lg(lg[rank], d))
        e.copy_(_t(en[rank], d))
        return lg, en

    def step():
        tok = m.push(x, e)
        m.merge(x, e, req_t, bt_t, out=out, token=tok)

    lg, en = load(0)  # warm-up call, eager
    step()
    torch.cuda.synchronize()
    compare(_host(out), dcpx.ref_call(shape, lg, en, rank, req, bt), R)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    times = []
    for call in range(1, calls):
        lg, en = load(call)
        t0 = time.perf_counter()
        g.replay()
        times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        compare(_host(out), dcpx.ref_call(shape, lg, en, rank, req, bt), R)
    _leave(c, m)
    return calls, float(np.median(times) * 1e6)


def run_graph_after_refusal(rank, sock, group, shape, ngpu, calls):
    """A call libdcpx refuses (a C caller's merge of more rows than the
    shape's) fails the rank; a CUDA graph of push + merge captured before
    it makes no library call when it is replayed after it, yet must fail
    too (valid_out -1 on every row: the device's stop word, which the
    refusal sets) until dcpx_recover; after the recovery the replays are
    exact again."""
    import torch
    from dcpx._lib import call_in, merge_out
    c, m, d = _join(rank, sock, group, shape, ngpu)
    R, L = shape.rows, shape.max_local
    req, bt, req_t, bt_t, x, e, out = _static_buffers(rank, shape, d)

    def load(call):
        lg, en = inputs(43, call, shape.world, R, L, "random")
        x.copy_(_lg(lg[rank], d))
        e.copy_(_t(en[rank], d))
        return lg, en

    def step():
        tok = m.push(x, e)
        m.merge(x, e, req_t, bt_t, out=out, token=tok)

    def replay_exact(call):
        lg, en = load(call)
        g.replay()
        torch.cuda.synchronize()
        compare(_host(out), dcpx.ref_call(shape, lg, en, rank, req, bt), R)

    load(0)
    step()  # warm-up, eager
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    replay_exact(1)
    st = ctypes.c_void_p(torch.cuda.current_stream(d).cuda_stream)
    m.push(x, e)
    cin = call_in(R + 1, x.data_ptr(), L, e.data_ptr(), req_t.data_ptr(),
                  bt_t.data_ptr(), bt.shape[0], bt.shape[1])
    cout = merge_out(out.rows_out.data_ptr(), out.valid_out.data_ptr(),
                     out.ids_out.data_ptr())
    r = m._call(m._lib.dcpx_merge, ctypes.byref(cin), ctypes.byref(cout), st)
    assert r == dcpx.RangeError.code, f"merge of R + 1 rows: {r}"
    load(2)
    g.replay()
    torch.cuda.synchronize()
    valid = out.valid_out.cpu().numpy()
    assert (valid == -1).all(), f"replay after a refusal: valid_out {valid}"
    m.recover(timeout_ms=20000)
    replay_exact(3)
    _leave(c, m)
    return calls


def run_compile(rank, sock, group, shape, ngpu, calls):
    """A decode-step function compiled with torch.compile(fullgraph=True):
    the indexer logits, push, merge and the KV gather in one graph."""
    import torch
    assert dcpx.torch_ops_available
    c, m, d = _join(rank, sock, group, shape, ngpu)
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    kv = torch.randn((R * bt.shape[1] * shape.block_size, 4), device=d)

    def step(logits_f32, ends):
        lg = logits_f32.to(torch.bfloat16)
        tok = m.push(lg, ends)
        res = m.merge(lg, ends, req_t, bt_t, token=tok, sat=True)
        gathered = kv.index_select(0, res.rows_out.clamp(min=0).view(-1))
        return res.rows_out, res.valid_out, res.ids_out, res.sat_word, \
            gathered

    cstep = torch.compile(step, fullgraph=True)
    for call in range(calls):
        lg, en = inputs(51, call, shape.world, R, L,
                        ("random", "ties", "skew")[call % 3])
        f32 = torch.from_numpy(dcpx.from_bf16_bits(lg[rank])).to(d)
        r, v, i, s, gth = cstep(f32, _t(en[rank], d))
        assert gth.shape == (R * shape.topk, 4)
        got = dcpx.MergeResult(r.cpu().numpy(), v.cpu().numpy(),
                               i.cpu().numpy(), s.cpu().numpy())
        compare(got, dcpx.ref_call(shape, lg, en, rank, req, bt), R)
    _leave(c, m)
    return calls


def restart_main(q, restarted, sock, group, shape):
    """test_cuda_daemon_restart's rank: two exact calls, then (once the
    test killed dcpxd and started it again) dcpx_poll until the member is
    reattached, and two more exact calls."""
    try:
        import torch
        torch.cuda.set_device(0)
        c = dcpx.Client(sock)
        m = c.join(shape, rank=0, group=group, backend=dcpx.Backend.CUDA,
                   device=0, timeout_ns=5_000_000_000)
        d = torch.device("cuda", 0)
        R, L = shape.rows, shape.max_local
        req, bt = tables(0, R, L, shape.block_size)
        req_t, bt_t = _t(req, d), _t(bt, d)

        def call(k):
            lg, en = inputs(37, k, shape.world, R, L,
                            ("random", "ties", "skew")[k % 3])
            x, e = _lg(lg[0], d), _t(en[0], d)
            m.push(x, e, call_tag=k)
            res = m.merge(x, e, req_t, bt_t, sat=True, call_tag=k)
            compare(_host(res), dcpx.ref_call(shape, lg, en, 0, req, bt), R)

        call(0)
        call(1)
        q.put(("ready", 0, None))
        assert restarted.wait(120), "the test did not restart dcpxd"
        end = time.monotonic() + 30
        while m.poll() != 0:
            assert time.monotonic() < end, "not reattached within 30 s"
            time.sleep(0.05)
        call(2)
        call(3)
        m.leave()
        c.close()
        q.put(("ok", 0, None))
    except BaseException:  # noqa: BLE001
        q.put(("err", 0, traceback.format_exc()))


def _nccl_member(rank, sock, group, shape, ngpu, seed,
                 timeout_ns=5_000_000_000):
    """An nccl member and its inputs: (client, member, call), where
    call(tag, between=None) runs one push, between(), the merge, and checks
    it against the reference."""
    import torch
    c, m, d = _join(rank, sock, group, shape, ngpu, dcpx.Transport.NCCL,
                    timeout_ns=timeout_ns)
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = _t(req, d), _t(bt, d)
    lg, en = inputs(seed, 0, shape.world, R, L, "random")
    x, e = _lg(lg[rank], d), _t(en[rank], d)
    ref = dcpx.ref_call(shape, lg, en, rank, req, bt)

    def call(tag, between=None):
        m.push(x, e, call_tag=tag)
        if between:
            between()  # on the stream, between push and merge
        res = m.merge(x, e, req_t, bt_t, sat=True, call_tag=tag)
        compare(_host(res), ref, R)
        torch.cuda.synchronize()

    return c, m, call


def _nccl_reset(rank, sock, group, shape, ngpu, seed):
    """An nccl member (W=1) after one exact call and an operator reset of
    its group (the abort seen): (client, member, call, reset), where
    call(tag) runs one push + merge and checks it against the reference
    and reset() resets the group again."""
    import os
    import subprocess
    c, m, call = _nccl_member(rank, sock, group, shape, ngpu, seed)

    def reset():
        ctl = os.path.join(os.path.dirname(os.environ["DCPXD"]), "dcpxctl")
        subprocess.run([ctl, "--socket", sock, "reset", "--group", group],
                       check=True, capture_output=True, timeout=30)
        end = time.monotonic() + 10
        while m.health().abort == 0:
            assert time.monotonic() < end, "the reset did not abort"
            time.sleep(0.01)

    call(0)
    reset()
    return c, m, call, reset


def run_nccl_refused(rank, sock, group, shape, ngpu, calls):
    """The nccl transport after a refused call: an operator reset aborts
    the group, the member's next push is refused (Aborted) and aborts its
    communicator (a collective would wait without a bound for peers that
    issue nothing more); each recovery makes a new one (from rank 0's
    fresh id), and the calls after it are exact; leave is prompt."""
    c, m, call, reset = _nccl_reset(rank, sock, group, shape, ngpu, 71)
    try:
        call(1)
    except dcpx.Aborted:
        pass
    else:
        raise AssertionError("a push while aborted was not refused")
    m.recover(timeout_ms=20000)
    for tag in (2, 3):
        call(tag)
    # A merge whose group an operator aborted after its push: refused
    # (Aborted), and the reason stays the operator's; it read "this rank
    # refused an earlier call" (the merge failed the rank as a refusal).
    try:
        call(4, between=reset)
    except dcpx.Aborted:
        pass
    else:
        raise AssertionError("a merge while aborted was not refused")
    why = m.async_error().reason
    assert why == dcpx.Reason.OPERATOR, f"reason {why!r}"
    m.recover(timeout_ms=20000)
    call(5)
    t0 = time.monotonic()
    m.leave()
    c.close()
    return time.monotonic() - t0


def run_nccl_recover(rank, sock, group, shape, ngpu, calls):
    """test_gpu.test_cuda_nccl_recover: recover right after the reset (no
    call in between) aborts the communicator and makes a new one; the
    calls after it are exact; a second reset and recovery do it again.
    Returns the longest recover."""
    c, m, call, reset = _nccl_reset(rank, sock, group, shape, ngpu, 72)
    took = 0.0
    for round_ in range(2):
        if round_:
            reset()
        t0 = time.monotonic()
        m.recover(timeout_ms=20000)
        took = max(took, time.monotonic() - t0)
        gen = m.health().generation
        for tag in range(3):
            call(10 * round_ + tag)
        assert m.health().generation == gen
    m.leave()
    c.close()
    return took


def run_nccl_stall(rank, sock, group, shape, ngpu, calls):
    """test_gpu.test_cuda_nccl_stall: the nccl transport's stall watch
    through dcpxd (W=1, a 300 ms wait limit) fails no healthy rank: idle
    time after a whole call, nor a push whose merge comes three limits
    later (the stream marks the end of the push's all-gather), nor the
    device work of a long kernel of the engine's between them (a
    torch.cuda._sleep on the stream). Each call exact, the group healthy.
    (A stalled peer needs two GPUs: gpu-run.sh faults2, stop2nccl.)
    Returns the seconds of idle and busy time the checks covered."""
    import torch
    c, m, call = _nccl_member(rank, sock, group, shape, ngpu, 73,
                              timeout_ns=300_000_000)
    covered = 0.0
    call(0)
    time.sleep(0.9)
    covered += 0.9
    assert m.health().ok, "idle time after a whole call failed the rank"
    call(1, between=lambda: (torch.cuda.synchronize(), time.sleep(0.9)))
    covered += 0.9
    assert m.health().ok, "a merge that came late failed the rank"
    call(2)
    # device work between a push and its merge: a kernel of about 0.9 s
    t0 = time.monotonic()
    call(3, between=lambda: torch.cuda._sleep(int(0.9 * 2e9)))
    covered += time.monotonic() - t0
    assert m.health().ok, "device work between push and merge failed the rank"
    call(4)
    assert m.health().ok
    m.leave()
    c.close()
    return covered
