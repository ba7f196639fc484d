import os, sys, time, signal, threading
sys.path.insert(0, "/tmp/audit-fd")
os.environ["DSOCK"] = "/tmp/review-d/s"; os.environ["DSTATE"] = "/tmp/review-d/st"
import dp
dp.DCPXD = "/work/main/build-host/daemon/dcpxd"
from dp import *
import fusesrv

def memfds(pid):
    n = 0
    for f in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, f)).startswith("/memfd:"): n += 1
        except OSError: pass
    return n
SH = dict(rows=64, topk=64, local_topk=16, max_local=256)
fusesrv.mount("/tmp/review-d/fmnt")
ffd = os.open("/tmp/review-d/fmnt/f", os.O_RDWR)
MINOR = os.minor(os.stat("/tmp/review-d/fmnt").st_dev)
p = dp.start_daemon(log="/tmp/review-d/dcpxd.log")
pid = p.pid
time.sleep(0.2)
print("start: fds", nfds(pid), "memfds", memfds(pid))
conns, fds, jr = form_group("g0", world=2, shape=SH)
print("g0 formed: fds", nfds(pid), "memfds", memfds(pid))
for f in fds: os.close(f)
for s in conns: s.close()
time.sleep(0.5)
print("after group g0 left (closer healthy): fds", nfds(pid), "memfds", memfds(pid))
fusesrv.SLOW["flush"] = 3600.0
s = session()
send(s, query(1), [ffd])
data, _ = recv(s); print("query reply", reply_of(*parse_frame(data))[:2])
time.sleep(0.5)
for i in range(3):
    conns, fds, jr = form_group("g%d" % (i+1), world=2, shape=SH)
    for f in fds: os.close(f)
    for s2 in conns: s2.close()
time.sleep(1.0)
print("after 3 more groups formed+left (closer stuck): fds", nfds(pid), "memfds", memfds(pid))
nul = os.open("/dev/null", os.O_RDONLY)
for i in range(200):
    s3 = session()
    send(s3, query(1), [nul] * 20)
    try: recv(s3, 5)
    except Exception: pass
    s3.close()
time.sleep(0.5)
print("after 200 queries with 20 fds each: fds", nfds(pid), "memfds", memfds(pid))
t = time.monotonic()
os.kill(pid, signal.SIGTERM)
try:
    p.wait(10); print("SIGTERM exit after %.2f s rc=%s" % (time.monotonic() - t, p.returncode))
except Exception:
    print("did not exit in 10s"); os.kill(pid, signal.SIGKILL); p.wait()
open("/sys/fs/fuse/connections/%d/abort" % MINOR, "w").write("1")
os._exit(0)
