from cases1 import *
W2 = 11; SH = {"world": W2, "rows": 1, "topk": 2, "local_topk": 1}
p = start_daemon()
conns, real, jr = form_group("cw", world=W2, shape=SH)
print("ctl", os.fstat(real[0]).st_size, "ws", os.fstat(real[1]).st_size)
os.kill(p.pid, signal.SIGKILL); p.wait()
for s in conns: s.close()
p = start_daemon(); DPID[0] = p.pid
fds = list(real); fds[1] = real[0]
ss = []
s, st, err = reattach("cw", 0, fds, world=W2, shape=SH); print("adopt with ws0=ctl:", st, err); ss.append(s)
for r in range(1, W2):
    s, st, err = reattach("cw", r, real, world=W2, shape=SH); assert st == 0, err; ss.append(s)
mm = mmap.mmap(real[0], 2304)
print("before: magic %#x secret0 %s" % (struct.unpack_from("<I", mm, 0)[0], mm[40:48].hex()))
for s in ss: send(s, fb(7, fv(1, 1)))
time.sleep(0.5)
for s in ss: send(s, fb(7, fv(1, 1)))
time.sleep(0.5)
print("after:  magic %#x version %d world %d rows %d secret0 %s gen %d" % (*struct.unpack_from("<IIII", mm, 0), mm[40:48].hex(), struct.unpack_from("<I", mm, 20)[0]))
print(time_ctl(("groups",))[2])
os.system("grep -i 'zeroed\\|recovered\\|fail' dcpxd.log | tail -4")
os.kill(p.pid, signal.SIGKILL); p.wait()
p = start_daemon(); DPID[0] = p.pid
s, st, err = reattach("cw", 1, real, world=W2, shape=SH); print("re-adopt after next restart:", st, err)
os.kill(p.pid, signal.SIGTERM); p.wait()
