import sys, os, signal, time, mmap
sys.path.insert(0, "/tmp/audit-fd"); sys.path.insert(0, "/work/main/python")
os.environ["DCPX_LIBRARY"] = "/work/main/build-host/libclient/.libs/libdcpx.so.0"
from matrix import *
import dcpx

def form_with_child(gname):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        s = session(); send(s, join(gname, 1, {"world": 2}))
        data, fds = recv(s); os.write(w, b"x"); time.sleep(1000); os._exit(0)
    s0 = session(); send(s0, join(gname, 0, {"world": 2}))
    data, fds = recv(s0); k, v = parse_frame(data); assert reply_of(k, v)[0] == 0
    os.read(r, 1)
    return s0, fds, pid

mode = sys.argv[1]
gname = "cq_" + mode
p = start_daemon()
s0, real, child = form_with_child(gname)
os.kill(p.pid, signal.SIGKILL); p.wait(); s0.close()
p = start_daemon()
os.kill(child, signal.SIGKILL); os.waitpid(child, 0)
if mode == "rdonly":
    fds = [real[0], real[1], reopen(real[2], os.O_RDONLY)]
elif mode == "alias":
    fds = [real[0], real[1], real[1]]
elif mode == "fwrite":
    fds = [real[0], real[1], copy_memfd(real[2], S_SHRINK|S_GROW|S_FWRITE)]
elif mode == "fake":
    fds = [real[0], real[1], memfd(os.fstat(real[2]).st_size)]
s, st, err = reattach(gname, 0, fds)
print("adopt:", st, err)
time.sleep(0.3)
print(time_ctl()[2])
# raw replacement to inspect fds
s2 = session(); send(s2, join(gname, 1, {"world": 2}))
data, rf = recv(s2); k, v = parse_frame(data); print("raw repl:", reply_of(k, v))
for i, fd in enumerate(rf):
    st_ = os.fstat(fd); fl = fcntl.fcntl(fd, fcntl.F_GETFL) & 3
    try:
        mm = mmap.mmap(fd, st_.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE); mm.close(); ok = "rw-map ok"
    except OSError as e:
        ok = "rw-map FAIL %s" % e
    print("  fd", i, "ino", st_.st_ino, "acc", fl, "seals", fcntl.fcntl(fd, F_GET_SEALS), ok)
def ack(sock):
    send(sock, fb(7, fv(1, 1)))
for i in range(3):
    ack(s); ack(s2); time.sleep(0.3)
    for sock in (s, s2):
        sock.settimeout(0.2)
        try:
            while True:
                d, _ = recv(sock, 0.2); k, v = parse_frame(d); dd = decode(v)
                print("   got", k, {kk: vv for kk, vv in dd.items()})
        except Exception: pass
print("my real ws inodes:", [os.fstat(f).st_ino for f in real])
time.sleep(0.5)
os.system("tail -12 /tmp/audit-fd/dcpxd.log")
os.kill(p.pid, signal.SIGTERM); p.wait()
