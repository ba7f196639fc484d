"""GPU tests (torch CUDA tensors, CUDA graphs, torch.compile, the example,
the per-call overhead). Skipped without torch, a GPU or a libdcpx built
with CUDA. On the GPU machine, from a build with CUDA:

    DCPX_LIBRARY=build-gpu/libclient/.libs/libdcpx.so.0 \\
    DCPXD=build-gpu/daemon/dcpxd PYTHONPATH=python \\
    python3 -m pytest -p no:cacheprovider -v -s python/tests/test_gpu.py
"""

import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

import dcpx

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
NGPU = torch.cuda.device_count()


@pytest.fixture(scope="module")
def cuda_ok(daemon):
    """Skips when libdcpx was built without CUDA."""
    s = dcpx.Shape(world=1, rows=1, topk=4, local_topk=1, max_local=16)
    try:
        with dcpx.Client(daemon.socket).join(
                s, rank=0, group=f"probe-{os.getpid()}",
                backend=dcpx.Backend.CUDA, device=0):
            pass
    except dcpx.NotSupported:
        pytest.skip("libdcpx built without CUDA")


def _spawn(mode, world, sock, group, shape, calls=6, timeout=300):
    import _gpu_ranks
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(world)
    ps = [ctx.Process(target=_gpu_ranks.rank_main,
                      args=(mode, r, q, barrier, sock, group, shape, NGPU,
                            calls))
          for r in range(world)]
    for p in ps:
        p.start()
    out, errs = {}, []
    try:
        for _ in range(world):
            st, r, v = q.get(timeout=timeout)
            (out.__setitem__(r, v) if st == "ok"
             else errs.append(f"rank {r}: {v}"))
    finally:
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not errs, "\n".join(errs)
    return out


WORLDS = sorted({1, 2, min(8, max(2, NGPU))})


@pytest.mark.parametrize("W", WORLDS)
def test_cuda_eager_exact(daemon, cuda_ok, group, W):
    shape = dcpx.Shape(world=W, rows=8, topk=128, local_topk=0,
                       block_size=16, interleave=1, max_local=4096)
    out = _spawn("eager", W, daemon.socket, group, shape)
    assert len(out) == W


@pytest.mark.parametrize("W", WORLDS)
def test_cuda_push_list(daemon, cuda_ok, group, W):
    """Member.push_list on the CUDA backend (dcpx_push_list's kernel)."""
    shape = dcpx.Shape(world=W, rows=8, topk=128, local_topk=0,
                       block_size=16, interleave=1, max_local=1024)
    out = _spawn("push_list", W, daemon.socket, group, shape)
    assert len(out) == W


@pytest.mark.parametrize("W", WORLDS)
def test_cuda_empty_calls(daemon, cuda_ok, group, W):
    """An empty call may pass NULL for every array (dcpx.h), push_list's
    lists included: it succeeds, and the calls after it are exact (an
    empty push_list with no lists failed the rank)."""
    shape = dcpx.Shape(world=W, rows=4, topk=128, local_topk=0,
                       block_size=16, interleave=1, max_local=1024)
    out = _spawn("empty", W, daemon.socket, group, shape, calls=3)
    assert len(out) == W


@pytest.mark.parametrize("W", sorted({1, min(2, NGPU)}))
def test_cuda_push_list_nccl(daemon, cuda_ok, group, W):
    """Member.push_list on the NCCL transport: NotSupported, and the rank
    goes on with push (it used to fail and abort the group)."""
    shape = dcpx.Shape(world=W, rows=4, topk=128, local_topk=0,
                       block_size=16, interleave=1, max_local=1024)
    try:
        out = _spawn("push_list_nccl", W, daemon.socket, group, shape, calls=3)
    except AssertionError as e:
        if "built without NCCL" in str(e):  # python/gpu-build.sh's build
            pytest.skip("libdcpx built without NCCL")
        raise
    assert len(out) == W


@pytest.mark.skipif(NGPU < 2, reason="needs two GPUs")
def test_cuda_other_current_device(daemon, cuda_ok, group):
    """Calls from a thread whose current GPU is not the member's, on the
    default stream: run on the member's GPU, exact."""
    shape = dcpx.Shape(world=2, rows=4, topk=128, local_topk=0,
                       block_size=16, interleave=1, max_local=1024)
    _spawn("other_device", 2, daemon.socket, group, shape, calls=3)


@pytest.mark.parametrize("W", WORLDS)
def test_cuda_graph_capture(daemon, cuda_ok, group, W):
    shape = dcpx.Shape(world=W, rows=8, topk=128, local_topk=0,
                       block_size=16, interleave=2, max_local=4096)
    out = _spawn("graph", W, daemon.socket, group, shape, calls=8)
    print(f"\nW={W}: graph replay of push+merge, host side "
          f"{[round(v[1], 1) for v in out.values()]} us")


def test_cuda_graph_after_refusal(daemon, cuda_ok, group):
    """A graph replayed after a call libdcpx refused fails its rows until
    dcpx_recover, then is exact again (the refusal sets the device's stop
    word: the replay makes no library call)."""
    shape = dcpx.Shape(world=1, rows=8, topk=128, local_topk=32,
                       block_size=16, max_local=4096)
    _spawn("graph_after_refusal", 1, daemon.socket, group, shape)


def test_cuda_bad_arrays(daemon, cuda_ok, group):
    """Arrays a kernel of the member's GPU cannot touch (host memory from
    malloc, an array running into unmapped space, another GPU's memory)
    are refused with InvalidArgument's code before any launch; the
    context stays usable and the calls after recovery are exact."""
    shape = dcpx.Shape(world=1, rows=4, topk=128, local_topk=32,
                       block_size=16, max_local=1024)
    _spawn("bad_arrays", 1, daemon.socket, group, shape, calls=2)


def test_cuda_stride_nocheck(daemon, cuda_ok, group):
    """With DCPX_PTR_CHECK=0, a stride whose rows run past the end of the
    address space is still refused before a launch; the calls after
    recovery are exact."""
    shape = dcpx.Shape(world=1, rows=4, topk=128, local_topk=32,
                       block_size=16, max_local=1024)
    _spawn("stride_nocheck", 1, daemon.socket, group, shape, calls=2)


def _spawn_nccl(mode, daemon, group):
    """_spawn of an nccl mode at W=1 (skipped without dcpxctl beside
    $DCPXD, or without NCCL in the build)."""
    if not os.access(os.path.join(os.path.dirname(os.environ.get(
            "DCPXD", "")), "dcpxctl"), os.X_OK):
        pytest.skip("no dcpxctl beside $DCPXD")
    shape = dcpx.Shape(world=1, rows=8, topk=128, local_topk=32,
                       block_size=16, max_local=4096)
    try:
        return _spawn(mode, 1, daemon.socket, group, shape)
    except AssertionError as e:
        if "built without NCCL" in str(e):
            pytest.skip("libdcpx built without NCCL")
        raise


def test_cuda_nccl_refused(daemon, cuda_ok, group):
    """nccl transport, W=1: a refused call aborts the member's communicator;
    dcpx_recover makes a new one and the calls after it are exact; leave
    is prompt."""
    out = _spawn_nccl("nccl_refused", daemon, group)
    assert out[0] < 5.0, f"leave took {out[0]:.1f} s"


def test_cuda_nccl_recover(daemon, cuda_ok, group):
    """nccl transport, W=1: after an operator reset, with no call in
    between, dcpx_recover aborts the member's communicator before it
    drains the stream (with a dead peer a collective would wait on the
    GPU without a bound), then makes a new one from rank 0's fresh id
    (docs/PROTOCOL.md 6.9); the calls after it are exact, twice over."""
    out = _spawn_nccl("nccl_recover", daemon, group)
    assert out[0] < 5.0, f"recover took {out[0]:.1f} s"


def test_cuda_nccl_stall(daemon, cuda_ok, group):
    """nccl transport, W=1, a 300 ms wait limit: the stall watch fails no
    healthy rank (idle time after a call, a merge that comes three limits
    after its push, device work between them); docs/PROTOCOL.md 7."""
    covered = _spawn_nccl("nccl_stall", daemon, group)[0]
    assert covered >= 2.5, f"only {covered:.2f} s covered"


def test_cuda_daemon_restart(cuda_ok, group):
    """dcpxd killed (-9) and started again on its socket and state dir: a
    CUDA member reattaches (the new dcpxd adopts its workspace, on the GPU
    the join's UUID names) and its calls stay exact."""
    import _gpu_ranks
    from dcpx.testing import PrivateDaemon
    shape = dcpx.Shape(world=1, rows=8, topk=128, local_topk=32,
                       block_size=16, max_local=4096)
    d = PrivateDaemon().start()
    try:
        ctx = mp.get_context("spawn")
        q, ev = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=_gpu_ranks.restart_main,
                        args=(q, ev, d.socket, group, shape))
        p.start()
        st, _, v = q.get(timeout=120)
        assert st == "ready", v
        d.proc.kill()
        d.proc.wait()
        with open(d.log, "ab") as log:
            d.proc = subprocess.Popen(d.args, stdout=log, stderr=log,
                                      stdin=subprocess.DEVNULL)
        ev.set()
        st, _, v = q.get(timeout=120)
        assert st == "ok", v
        p.join(30)
        assert "adopted after a dcpxd restart" in d.read_log(), d.read_log()
    finally:
        d.stop()


@pytest.mark.parametrize("W", [1, 2])
def test_torch_compile_fullgraph(daemon, cuda_ok, group, W):
    if not dcpx.torch_ops_available:
        pytest.skip("torch < 2.4: no torch.library.custom_op")
    shape = dcpx.Shape(world=W, rows=4, topk=64, local_topk=0,
                       block_size=8, interleave=1, max_local=2048)
    _spawn("compile", W, daemon.socket, group, shape, calls=4)


EXAMPLE_WORLDS = sorted({min(NGPU, 8), 8})


@pytest.mark.parametrize("W", EXAMPLE_WORLDS)
def test_example_cuda_graph(cuda_ok, W):
    """The example with a CUDA graph per step: one rank per GPU, and W=8
    on fewer GPUs only under MPS (CUDA_MPS_PIPE_DIRECTORY set)."""
    if W > NGPU and not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        pytest.skip(f"W={W} on {NGPU} GPU(s) needs MPS: start "
                    "nvidia-cuda-mps-control -d with "
                    "CUDA_MPS_PIPE_DIRECTORY set")
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "..", "examples",
                                      "decode_step.py"),
         "--world", str(W), "--layers", "4", "--steps", "3",
         "--backend", "cuda", "--local-len", "8192", "--rows", "16",
         "--topk", "512"], capture_output=True, text=True, timeout=600)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr


def test_overhead_per_call(daemon, cuda_ok, group):
    """Host-side cost per push+merge: raw ctypes call, Member eager, and a
    captured graph's replay (W=1, so no peer is waited for)."""
    import ctypes

    from dcpx._lib import call_in, lib, merge_out
    R, K, L = 16, 256, 4096
    shape = dcpx.Shape(world=1, rows=R, topk=K, local_topk=0, block_size=16,
                       max_local=L)
    d = torch.device("cuda", 0)
    torch.cuda.set_device(0)
    with dcpx.Client(daemon.socket).join(shape, group=group,
                                         backend=dcpx.Backend.CUDA,
                                         device=0) as m:
        x = torch.randn((R, L), device=d).to(torch.bfloat16)
        e = torch.full((R,), L, dtype=torch.int32, device=d)
        req = torch.arange(R, dtype=torch.int32, device=d)
        bt = torch.arange(R * (L // 16), dtype=torch.int32,
                          device=d).view(R, L // 16)
        out = dcpx.MergeResult(torch.empty((R, K), dtype=torch.int32,
                                           device=d),
                               torch.empty(R, dtype=torch.int32, device=d),
                               torch.empty((R, K), dtype=torch.int32,
                                           device=d), None)
        n = 300
        s = torch.cuda.current_stream().cuda_stream
        C = lib()
        mp_ = ctypes.c_void_p(m._ptr)  # the raw member, for ctypes calls

        cin = ctypes.byref(call_in(R, x.data_ptr(), L, e.data_ptr(),
                                   req.data_ptr(), bt.data_ptr(), R,
                                   L // 16))
        cout = ctypes.byref(merge_out(out.rows_out.data_ptr(),
                                      out.valid_out.data_ptr(),
                                      out.ids_out.data_ptr(), None))

        def raw():
            assert C.dcpx_push(mp_, cin, s) == 0
            assert C.dcpx_merge(mp_, cin, cout, s) == 0

        def eager():
            m.push(x, e)
            m.merge(x, e, req, bt, out=out)

        def timed(f):
            f()
            torch.cuda.synchronize()
            best = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                best.append(((t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6))
            return min(best)

        pc = m.prepare(x, e, req, bt, out=out)
        raw_us = timed(raw)
        eager_us = timed(eager)
        prep_us = timed(pc)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            eager()
        graph_us = timed(g.replay)
        print(f"\npush+merge per call (host enqueue, wall incl. GPU): "
              f"ctypes {raw_us[0]:.1f}/{raw_us[1]:.1f} us, "
              f"Member eager {eager_us[0]:.1f}/{eager_us[1]:.1f} us, "
              f"PreparedCall {prep_us[0]:.1f}/{prep_us[1]:.1f} us, "
              f"graph replay {graph_us[0]:.1f}/{graph_us[1]:.1f} us; "
              f"eager overhead over ctypes "
              f"{eager_us[0] - raw_us[0]:.1f} us")
        assert (out.valid_out.cpu() >= 0).all()
