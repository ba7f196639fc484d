from cases1 import *
GB = int(sys.argv[1]) if len(sys.argv) > 1 else 8
p = start_daemon(); DPID[0] = p.pid; DPROC[0] = p
fd = os.memfd_create("huge", 0)
t = time.monotonic(); os.posix_fallocate(fd, 0, GB << 30); print("populate %.2fs" % (time.monotonic() - t))
th = threading.Thread(target=prober, daemon=True); th.start()
time.sleep(0.5)
s = session()
cur[0] = "close-huge"
t = time.monotonic()
send(s, join("nosuch", 0, {"world": 2}, reattach=True), [fd, fd, fd])
os.close(fd)
data, _ = recv(s); k, v = parse_frame(data); print("reply", reply_of(k, v), "%.1f ms" % ((time.monotonic() - t) * 1e3))
time.sleep(1.5); cur[0] = "after"; time.sleep(0.3)
stop.set(); th.join()
for k, v in lat["per"].items(): print("  %-10s max %.1f ms n=%d" % (k, v[0] * 1e3, v[1]))
os.kill(p.pid, signal.SIGTERM); p.wait()
