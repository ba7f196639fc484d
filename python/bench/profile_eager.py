"""Where the eager Member.push/merge path spends its host time (GPU machine).

Runs W=1 calls with the CUDA backend through a private dcpxd, as
tests/test_gpu.py's overhead test does, times the raw ctypes calls, the
eager calls and a PreparedCall's, and prints cProfile's top functions of
the eager loop by own time. Run from the repository root with
build-pygpu/ (python/gpu-build.sh): python/gpu-run.sh --profile.
"""

import cProfile
import ctypes
import pstats
import sys
import time

import torch

import dcpx
import dcpx.testing
from dcpx._lib import call_in, lib, merge_out


def timed(f, n=300):
    f()
    torch.cuda.synchronize()
    best = None
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        us = (t1 - t0) / n * 1e6
        best = us if best is None else min(best, us)
    return best


def main() -> int:
    R, K, L = 16, 256, 4096
    shape = dcpx.Shape(world=1, rows=R, topk=K, local_topk=0, block_size=16,
                       max_local=L)
    d = torch.device("cuda", 0)
    torch.cuda.set_device(0)
    with dcpx.testing.PrivateDaemon() as daemon, \
            dcpx.Client(daemon.socket).join(shape, group="prof",
                                            backend=dcpx.Backend.CUDA,
                                            device=0) as m:
        x = torch.randn((R, L), device=d).to(torch.bfloat16)
        e = torch.full((R,), L, dtype=torch.int32, device=d)
        req = torch.arange(R, dtype=torch.int32, device=d)
        bt = torch.arange(R * (L // 16), dtype=torch.int32,
                          device=d).view(R, L // 16)
        out = dcpx.MergeResult(
            torch.empty((R, K), dtype=torch.int32, device=d),
            torch.empty(R, dtype=torch.int32, device=d),
            torch.empty((R, K), dtype=torch.int32, device=d), None)
        s = torch.cuda.current_stream().cuda_stream
        C = lib()
        mp_ = ctypes.c_void_p(m._ptr)  # the raw member, for ctypes calls
        cin = ctypes.byref(call_in(R, x.data_ptr(), L, e.data_ptr(),
                                   req.data_ptr(), bt.data_ptr(), R, L // 16))
        cout = ctypes.byref(merge_out(out.rows_out.data_ptr(),
                                      out.valid_out.data_ptr(),
                                      out.ids_out.data_ptr(), None))

        def raw():
            C.dcpx_push(mp_, cin, s)
            C.dcpx_merge(mp_, cin, cout, s)

        def eager():
            m.push(x, e)
            m.merge(x, e, req, bt, out=out)

        pc = m.prepare(x, e, req, bt, out=out)
        r, ea, p = timed(raw), timed(eager), timed(pc)
        print(f"push+merge host enqueue, us per call pair: ctypes {r:.1f}, "
              f"eager {ea:.1f} (+{ea - r:.1f}), PreparedCall {p:.1f} "
              f"(+{p - r:.1f})")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            eager()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof, stream=sys.stdout).sort_stats(
            "tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
