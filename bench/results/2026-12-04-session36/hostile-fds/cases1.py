from matrix import *

def put32(off, v):
    def f(d): d[off:off+4] = struct.pack("<I", v & 0xffffffff)
    return f
def put64(off, v):
    def f(d): d[off:off+8] = struct.pack("<Q", v)
    return f
def multi(*ps):
    def f(d):
        for p in ps: p(d)
    return f

def fifo():
    path = TMP + "/fifo%d" % time.monotonic_ns()
    os.mkfifo(path)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)

def regfile(size, content=b""):
    path = TMP + "/reg%d" % time.monotonic_ns()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    if content: os.pwrite(fd, content, 0)
    return fd

def shmfile(src):
    path = "/dev/shm/auditfd%d" % time.monotonic_ns()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    size = os.fstat(src).st_size
    os.ftruncate(fd, size); os.pwrite(fd, os.pread(src, size, 0), 0)
    os.unlink(path)
    return fd

def ctl_is(mk):
    return lambda real: [mk(real)] + real[1:]
def ws0_is(mk):
    return lambda real: [real[0], mk(real)] + real[2:]

CASES = [
 ("ctl=fifo-no-writer", ctl_is(lambda r: fifo())),
 ("ctl=pipe", ctl_is(lambda r: os.pipe()[0])),
 ("ctl=socket", ctl_is(lambda r: socket.socketpair()[0].detach())),
 ("ctl=/dev/zero", ctl_is(lambda r: os.open("/dev/zero", os.O_RDWR))),
 ("ctl=/dev/null", ctl_is(lambda r: os.open("/dev/null", os.O_RDWR))),
 ("ctl=directory", ctl_is(lambda r: os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY))),
 ("ctl=O_PATH(real ctl)", ctl_is(lambda r: reopen(r[0], os.O_PATH))),
 ("ctl=O_RDONLY(real ctl)", ctl_is(lambda r: reopen(r[0], os.O_RDONLY))),
 ("ctl=O_WRONLY(real ctl)", ctl_is(lambda r: reopen(r[0], os.O_WRONLY))),
 ("ctl=ext4 file right size+content", ctl_is(lambda r: regfile(768, os.pread(r[0], 768, 0)))),
 ("ctl=ext4 file size 0", ctl_is(lambda r: regfile(0))),
 ("ctl=ext4 file size 3", ctl_is(lambda r: regfile(3))),
 ("ctl=ext4 file huge sparse 1T", ctl_is(lambda r: regfile(1 << 40))),
 ("ctl=/dev/shm file copy", ctl_is(lambda r: shmfile(r[0]))),
 ("ctl=memfd copy unsealed", ctl_is(lambda r: copy_memfd(r[0], 0))),
 ("ctl=memfd copy SHRINK only", ctl_is(lambda r: copy_memfd(r[0], S_SHRINK))),
 ("ctl=memfd copy +WRITE seal", ctl_is(lambda r: copy_memfd(r[0], S_SHRINK|S_GROW|S_WRITE))),
 ("ctl=memfd copy +FUTURE_WRITE", ctl_is(lambda r: copy_memfd(r[0], S_SHRINK|S_GROW|S_FWRITE))),
 ("ctl=memfd sealed size 0", ctl_is(lambda r: memfd(0))),
 ("ctl=memfd sealed huge 1T", ctl_is(lambda r: memfd(1 << 40))),
 ("ctl=real ctl x3 (same fd)", lambda r: [r[0]] * 3),
 ("fds=none", lambda r: []),
 ("fds=1", lambda r: r[:1]),
 ("fds=2", lambda r: r[:2]),
 ("fds=4", lambda r: r + [r[2]]),
 ("fds=20", lambda r: r + [r[2]] * 17),
 ("fds=21", lambda r: r + [r[2]] * 18),
 ("fds=64", lambda r: r + [r[2]] * 61),
 ("ws0=fifo", ws0_is(lambda r: fifo())),
 ("ws0=ext4 file right size", ws0_is(lambda r: regfile(2560))),
 ("ws0=memfd unsealed", ws0_is(lambda r: copy_memfd(r[1], 0))),
 ("ws0=ctl fd", ws0_is(lambda r: r[0])),
 ("ws0=O_RDONLY(real ws0)", ws0_is(lambda r: reopen(r[1], os.O_RDONLY))),
 ("ws0=memfd copy +WRITE seal", ws0_is(lambda r: copy_memfd(r[1], S_SHRINK|S_GROW|S_WRITE))),
 ("ws0=memfd copy +FUTURE_WRITE", ws0_is(lambda r: copy_memfd(r[1], S_SHRINK|S_GROW|S_FWRITE))),
 ("ws0=ws1 (same memfd twice)", lambda r: [r[0], r[2], r[2]]),
 ("hdr magic bad", ctl_is(lambda r: copy_memfd(r[0], patch=put32(0, 0x12345678)))),
 ("hdr version 2", ctl_is(lambda r: copy_memfd(r[0], patch=put32(4, 2)))),
 ("hdr version 0xffffffff", ctl_is(lambda r: copy_memfd(r[0], patch=put32(4, 0xffffffff)))),
 ("hdr world 3", ctl_is(lambda r: copy_memfd(r[0], patch=put32(8, 3)))),
 ("hdr world 0xffffffff", ctl_is(lambda r: copy_memfd(r[0], patch=put32(8, 0xffffffff)))),
 ("hdr rows 0x10000", ctl_is(lambda r: copy_memfd(r[0], patch=put32(12, 0x10000)))),
 ("hdr secret flipped", ctl_is(lambda r: copy_memfd(r[0], patch=put32(40, 0)))),
]

if __name__ == "__main__":
    sel = sys.argv[1:] 
    cs = [c for c in CASES if not sel or any(x in c[0] for x in sel)]
    groups = setup(len(cs))
    th = threading.Thread(target=prober, daemon=True); th.start()
    for name, mk in cs:
        run_case(name, groups, mk)
    stop.set(); th.join()
    print("daemon alive:", DPROC[0].poll())
    print("max ctl latency per case (s):")
    for k, v in sorted(lat["per"].items(), key=lambda x: -x[1][0])[:5]:
        print("  %-34s %.4f (n=%d)" % (k, v[0], v[1]))
    print(time_ctl()[2])
    os.kill(DPID[0], signal.SIGTERM); print("exit", DPROC[0].wait())
