"""What the package adds to a push + merge on the host backend (any
machine, no GPU): the bare ctypes calls against a PreparedCall over the
same buffers, and the eager Member.push + Member.merge (every argument
checked on every call), W=1, rows 1, K 16 (so the C work is small and the
Python overhead shows). Prints min / median / max us per push + merge
over 5 runs of 20,000 calls each (5,000 for the eager calls). With torch
importable, also a PreparedCall over CPU torch tensors (its check that
no bound array moved reads each tensor's data_ptr, shape and
contiguity, dearer than a numpy array's shape and strides).

Run from a build tree (make) with the package on PYTHONPATH:
DCPX_LIBRARY=<build>/libclient/.libs/libdcpx.so.0 DCPXD=<build>/daemon/dcpxd
PYTHONPATH=python python3 python/bench/host_overhead.py
(point PYTHONPATH at another checkout's python/ to compare packages).
"""

import ctypes
import time

import numpy as np

import dcpx
import dcpx.testing
from dcpx._lib import call_in, lib, merge_out


def timed(f, n=20000, reps=5):
    for _ in range(2000):
        f()
    us = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        us.append((time.perf_counter() - t0) / n * 1e6)
    us.sort()
    return us[0], us[len(us) // 2], us[-1]


def main():
    shape = dcpx.Shape(world=1, rows=1, topk=16, local_topk=4, block_size=4,
                       max_local=64)
    with dcpx.testing.PrivateDaemon() as d, \
            dcpx.Client(d.socket).join(shape, group="overhead") as m:
        lg = np.zeros((1, 64), np.uint16)
        en = np.full(1, 64, np.int32)
        req = np.zeros(1, np.int32)
        bt = np.zeros((1, 16), np.int32)
        pc = m.prepare(lg, en, req, bt)
        p = pc.out
        cin = call_in(1, lg.ctypes.data, 64, en.ctypes.data, req.ctypes.data,
                      bt.ctypes.data, 1, 16)
        cout = merge_out(p.rows_out.ctypes.data, p.valid_out.ctypes.data,
                         p.ids_out.ctypes.data, None)
        L = lib()
        ptr = ctypes.c_void_p(m._ptr)  # m stays joined throughout

        def raw():
            L.dcpx_push(ptr, ctypes.byref(cin), None)
            L.dcpx_merge(ptr, ctypes.byref(cin), ctypes.byref(cout), None)

        def eager():  # every argument checked on every call
            m.push(lg, en)
            m.merge(lg, en, req, bt)

        r = timed(raw)
        q = timed(pc)
        e = timed(eager, n=5000)
        t = None
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:  # the same buffers' memory, as tensors
            tc = m.prepare(*(torch.from_numpy(x) for x in (lg, en, req, bt)))
            t = timed(tc)
        print(f"package {dcpx.__file__}")
        print("| what | min | median | max |\n|---|---:|---:|---:|")
        print(f"| raw ctypes push + merge | {r[0]:.2f} | {r[1]:.2f} | "
              f"{r[2]:.2f} |")
        print(f"| PreparedCall() | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} |")
        print(f"| Member.push + Member.merge (numpy) | {e[0]:.2f} | "
              f"{e[1]:.2f} | {e[2]:.2f} |")
        if t is not None:
            print(f"| PreparedCall() over CPU torch tensors | {t[0]:.2f} | "
                  f"{t[1]:.2f} | {t[2]:.2f} |")
        print(f"PreparedCall over raw (medians): {q[1] - r[1]:.2f} us"
              + (f" (torch: {t[1] - r[1]:.2f} us)" if t is not None
                 else ""))


if __name__ == "__main__":
    main()
