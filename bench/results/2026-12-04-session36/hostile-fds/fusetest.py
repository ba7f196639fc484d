from cases1 import *
import fusesrv
fusesrv.mount()
ffd = os.open("/tmp/audit-fd/fmnt/f", os.O_RDWR)
print("fuse file", os.fstat(ffd).st_size)
p = start_daemon(); DPID[0] = p.pid; DPROC[0] = p
th = threading.Thread(target=prober, daemon=True); th.start()
time.sleep(0.3)
mode = sys.argv[1]
fusesrv.SLOW[mode] = 5.0
s = session()
cur[0] = "fuse-" + mode
t = time.monotonic()
if mode == "getattr":
    send(s, join("nosuch", 0, {"world": 2}, reattach=True), [ffd, ffd, ffd])
else:
    send(s, query(1), [ffd])
os.close(ffd)
data, _ = recv(s, 30); k, v = parse_frame(data); print("reply", reply_of(k, v)[:2], "%.1f ms" % ((time.monotonic() - t) * 1e3))
time.sleep(6); cur[0] = "after"; time.sleep(0.3)
stop.set(); th.join()
for k, v in lat["per"].items(): print("  %-14s max %.1f ms n=%d" % (k, v[0] * 1e3, v[1]))
os.kill(p.pid, signal.SIGTERM); p.wait()
