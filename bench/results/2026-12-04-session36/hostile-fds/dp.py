"""Minimal raw dcpx daemon protocol client (hand-rolled protobuf)."""
import array, os, socket, struct, subprocess, time, signal

SOCK = os.environ.get("DSOCK", "/tmp/audit-fd/s")
STATE = os.environ.get("DSTATE", "/tmp/audit-fd/st")
DCPXD = "/work/main/build-host/daemon/dcpxd"
DCPXCTL = "/work/main/build-host/tools/dcpxctl"


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def zz(n):
    return (n << 1) ^ (n >> 63)


def fv(num, val):  # varint field
    return varint(num << 3) + varint(val)


def fb(num, data):  # length-delimited
    if isinstance(data, str):
        data = data.encode()
    return varint((num << 3) | 2) + varint(len(data)) + data


def decode(buf):
    """-> dict field -> list of raw values (int or bytes)"""
    out = {}
    i = 0
    while i < len(buf):
        key = 0
        s = 0
        while True:
            b = buf[i]; i += 1
            key |= (b & 0x7F) << s; s += 7
            if not b & 0x80:
                break
        num, wt = key >> 3, key & 7
        if wt == 0:
            v = 0; s = 0
            while True:
                b = buf[i]; i += 1
                v |= (b & 0x7F) << s; s += 7
                if not b & 0x80:
                    break
        elif wt == 2:
            l = 0; s = 0
            while True:
                b = buf[i]; i += 1
                l |= (b & 0x7F) << s; s += 7
                if not b & 0x80:
                    break
            v = buf[i:i + l]; i += l
        elif wt == 1:
            v = buf[i:i + 8]; i += 8
        elif wt == 5:
            v = buf[i:i + 4]; i += 4
        else:
            raise ValueError("wt %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def unzz(n):
    return (n >> 1) ^ -(n & 1)


def hello():
    return fb(1, fv(1, 1) + fb(2, "audit-fd"))


DEFAULT_SHAPE = dict(world=2, rows=2, topk=16, local_topk=4, block_size=4,
                     interleave=2, max_local=64)


def shape_bytes(sh):
    keys = ["world", "rows", "topk", "local_topk", "block_size", "interleave",
            "max_local"]
    return b"".join(fv(i + 1, sh[k]) for i, k in enumerate(keys))


def join(group, rank, shape=None, reattach=False, generation=0,
         timeout_ns=5_000_000_000, join_timeout_ms=10000):
    sh = dict(DEFAULT_SHAPE)
    if shape:
        sh.update(shape)
    j = (fb(1, group) + fb(2, shape_bytes(sh)) + fv(4, timeout_ns) +
         fv(5, rank) + fv(6, zz(-1)) + fb(7, "audit") +
         fv(9, join_timeout_ms))
    if reattach:
        j += fv(11, 1) + fv(12, generation)
    return fb(3, j)


def query(what=1, group=None):
    q = fv(1, what)
    if group:
        q += fb(2, group)
    return fb(8, q)


def connect(path=SOCK):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s


def send(s, data, fds=()):
    if fds:
        return s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", list(fds)))])
    return s.sendmsg([data])


def recv(s, timeout=10.0):
    s.settimeout(timeout)
    fds = array.array("i")
    data, anc, flags, _ = s.recvmsg(262145, socket.CMSG_LEN(64 * 4))
    for lvl, typ, d in anc:
        if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(d[:len(d) - (len(d) % 4)])
    return data, list(fds)


def parse_frame(data):
    f = decode(data)
    (k, v), = [(k, v[0]) for k, v in f.items()]
    return k, v


def reply_of(msgtype, body):
    """(status, error) of a Reply (2) or JoinReply (4)/QueryReply (9)'s reply."""
    d = decode(body)
    if msgtype in (4, 9):
        r = decode(d.get(1, [b""])[0])
    else:
        r = d
    st = unzz(r.get(1, [0])[0])
    err = r.get(2, [b""])[0].decode(errors="replace")
    return st, err


def session(path=SOCK):
    s = connect(path)
    send(s, hello())
    data, _ = recv(s)
    k, v = parse_frame(data)
    st, err = reply_of(k, v)
    assert st == 0, (st, err)
    return s


def start_daemon(extra=(), log="/tmp/audit-fd/dcpxd.log"):
    os.makedirs(STATE, exist_ok=True)
    try:
        os.unlink(SOCK)
    except FileNotFoundError:
        pass
    lf = open(log, "ab")
    p = subprocess.Popen([DCPXD, "--config=", "--socket=" + SOCK,
                          "--state-dir=" + STATE, *extra],
                         stdout=lf, stderr=lf)
    for _ in range(200):
        if os.path.exists(SOCK):
            try:
                connect().close()
                return p
            except OSError:
                pass
        time.sleep(0.02)
    raise RuntimeError("daemon did not start")


def nfds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def time_ctl(args=("groups",)):
    t = time.monotonic()
    r = subprocess.run([DCPXCTL, "--socket=" + SOCK, *args],
                       capture_output=True, text=True, timeout=60)
    return time.monotonic() - t, r.returncode, r.stdout + r.stderr


def form_group(group, world=2, shape=None):
    """Forms a host-backend group from this process with W connections.
    Returns (conns, fds [ctl, ws0..], joinreply dict)."""
    conns = []
    for r in range(world):
        s = session()
        sh = dict(shape or {})
        sh["world"] = world
        send(s, join(group, r, sh))
        conns.append(s)
    res = None
    for r, s in enumerate(conns):
        data, fds = recv(s)
        k, v = parse_frame(data)
        st, err = reply_of(k, v)
        assert st == 0, (st, err)
        if r == 0:
            res = (fds, decode(v))
        else:
            for fd in fds:
                os.close(fd)
    return conns, res[0], res[1]


def reattach(group, rank, fds, generation=1, shape=None, world=2,
             timeout=10.0):
    s = session()
    sh = dict(shape or {})
    sh.setdefault("world", world)
    send(s, join(group, rank, sh, reattach=True, generation=generation), fds)
    data, rfds = recv(s, timeout)
    for fd in rfds:
        os.close(fd)
    k, v = parse_frame(data)
    st, err = reply_of(k, v)
    return s, st, err
