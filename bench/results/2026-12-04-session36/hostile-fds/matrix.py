"""Hostile reattach matrix: each case on its own group, adopted (first
reattacher) with crafted fds; then the real fds must still adopt."""
import ctypes, fcntl, mmap, os, signal, socket, struct, sys, threading, time
sys.path.insert(0, "/tmp/audit-fd")
from dp import *

F_ADD_SEALS, F_GET_SEALS = 1033, 1034
S_SEAL, S_SHRINK, S_GROW, S_WRITE, S_FWRITE = 1, 2, 4, 8, 16
libc = ctypes.CDLL(None, use_errno=True)
TMP = "/tmp/audit-fd/files"
os.makedirs(TMP, exist_ok=True)

# background latency probe
lat = {"max": 0.0, "case": None, "per": {}}
cur = ["-"]
stop = threading.Event()


def prober():
    while not stop.is_set():
        c = cur[0]
        try:
            dt, rc, out = time_ctl()
        except Exception as e:
            dt, rc = 99, -1
        p = lat["per"].setdefault(c, [0.0, 0])
        p[0] = max(p[0], dt)
        p[1] += 1
        time.sleep(0.005)


def memfd(size, seals=S_SHRINK | S_GROW, content=None, name="x"):
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if content:
        os.pwrite(fd, content, 0)
    if seals:
        r = fcntl.fcntl(fd, F_ADD_SEALS, seals)
    return fd


def copy_memfd(src, seals=S_SHRINK | S_GROW, patch=None):
    size = os.fstat(src).st_size
    data = bytearray(os.pread(src, size, 0))
    if patch:
        patch(data)
    return memfd(size, seals, bytes(data))


def reopen(fd, flags):
    return os.open("/proc/self/fd/%d" % fd, flags)


W = 2
results = []


def run_case(name, groups, make_fds, expect_ok=False, also_legit=True,
             after=None):
    """make_fds(real) -> list of fds to send (ours: closed after)."""
    g = groups.pop(0)
    conns, real = g
    gname = name_of[id(g)]
    cur[0] = name
    before = nfds(DPID[0])
    fds = make_fds(real)
    t = time.monotonic()
    try:
        s, st, err = reattach(gname, 0, fds, world=W)
    except Exception as e:
        s, st, err = None, None, "EXC %r" % e
    dt = time.monotonic() - t
    for fd in set(fds):
        if fd not in real:
            try:
                os.close(fd)
            except OSError:
                pass
    time.sleep(0.05)
    mid = nfds(DPID[0])
    extra = ""
    if after and s is not None:
        extra = after(gname, real, s)
    if s is not None:
        s.close()
    time.sleep(0.05)
    alive = DPROC[0].poll() is None
    after_n = nfds(DPID[0]) if alive else -1
    legit = ""
    if also_legit and alive and st != 0:
        s2, st2, err2 = reattach(gname, 0, real, world=W)
        legit = "legit-after=%d %s" % (st2, err2[:60])
        s2.close()
    results.append((name, st, err, dt, before, mid, after_n, alive, legit,
                    extra))
    print("%-34s st=%s dt=%.1fms fds %d->%d->%d alive=%s | %s | %s %s" %
          (name, st, dt * 1e3, before, mid, after_n, alive, err[:150], legit,
           extra), flush=True)
    cur[0] = "-"


name_of = {}
DPID = [0]
DPROC = [None]


def setup(n, shape=None):
    p = start_daemon()
    groups = []
    for i in range(n):
        gname = "m%d_%d" % (os.getpid() % 1000, i) + str(time.monotonic_ns() % 100000)
        conns, fds, jr = form_group(gname, world=W, shape=shape)
        g = (conns, fds)
        name_of[id(g)] = gname
        groups.append(g)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    for g in groups:
        for s in g[0]:
            s.close()
    p = start_daemon()
    DPID[0] = p.pid
    DPROC[0] = p
    return groups
