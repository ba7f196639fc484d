"""No file descriptors or memory left behind by 1,000 join/leave cycles
(and connect/close cycles), measured on /proc/self."""

import os

import numpy as np

import dcpx


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_join_leave_cycles(daemon, group):
    shape = dcpx.Shape(world=1, rows=8, topk=64, local_topk=0,
                       block_size=4, max_local=1024)
    lg = np.zeros((8, 1024), np.uint16)
    en = np.full(8, 1024, np.int32)
    req = np.arange(8, dtype=np.int32)
    bt = np.arange(8 * 256, dtype=np.int32).reshape(8, 256)

    def cycle(i):
        with dcpx.Client(daemon.socket) as c:
            with c.join(shape, rank=0, group=f"{group}-{i % 7}") as m:
                if i % 10 == 0:
                    m.push(lg, en)
                    m.merge(lg, en, req, bt)
                    m.poll()
                    m.health()

    for i in range(50):  # warm up allocators and caches
        cycle(i)
    fd0, rss0 = _fds(), _rss_kib()
    for i in range(1000):
        cycle(i)
    fd1, rss1 = _fds(), _rss_kib()
    assert fd1 == fd0, f"fds {fd0} -> {fd1}"
    # 1,000 leaked members would be >= 1000 * (workspace + control page)
    assert rss1 - rss0 < 2048, f"RSS grew {rss0} -> {rss1} KiB"
    assert not dcpx.core._members  # every handle released


def test_connect_close_cycles(daemon):
    for _ in range(20):
        dcpx.Client(daemon.socket).close()
    fd0 = _fds()
    for _ in range(1000):
        with dcpx.Client(daemon.socket):
            pass
    assert _fds() == fd0
