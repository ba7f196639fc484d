#!/usr/bin/env python3
"""foreign-frames.py - how long dcpxd takes to refuse one hostile packet
(bench, not a test): a Frame holding a QueryReply (a message only dcpxd
sends) of 131,068 empty Records; a packet of the same size that is no
Frame; a Query (a message clients send) of 131,068 two-byte fields. Each
15 times, a new connection each; the time from the send to dcpxd's close.

    python3 bench/foreign-frames.py SOCKET   # a running dcpxd's socket

Needs root for the 2 MiB send buffer (SO_SNDBUFFORCE): the packet is 256
KiB, past the default SOCK_SEQPACKET send buffer.
"""
import socket, sys, time, os, subprocess, resource
sock = sys.argv[1]
def frame(n, field=9, each=b"\x1a\x00", inner=None):
    if inner is None:
        inner = each * n
    ln, v = b"", len(inner)
    while True:
        b = v & 0x7F; v >>= 7
        ln += bytes([b | (0x80 if v else 0)])
        if not v: break
    return bytes([(field << 3) | 2]) + ln + inner
def once(pkt):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setsockopt(socket.SOL_SOCKET, 32, 1 << 21)  # SO_SNDBUFFORCE
    s.connect(sock)
    t0 = time.perf_counter()
    s.send(pkt)
    s.settimeout(10)
    try:
        while s.recv(1 << 20): pass
    except (ConnectionResetError, socket.timeout): pass
    dt = time.perf_counter() - t0
    s.close()
    return dt
n = 131068
for what, pkt in (("QueryReply of %d empty Records" % n, frame(n)),
                  ("same size, not a Frame", b"\xff" * len(frame(n))),
                  ("Query (allowed case) of %d junk unknown fields" % n, frame(n, 8)),
                  ("Query of %d unknown 1-byte bytes fields" % (2 * n // 3),
                   frame(2 * n // 3, 8, b"\x7a\x01\x00")),
                  ("Join whose Shape holds %d unknown 1-byte bytes fields" % (2 * n // 3 - 1),
                   frame(0, 3, inner=frame(2 * n // 3 - 1, 2, b"\x7a\x01\x00")))):
    ts = sorted(once(pkt) for _ in range(15))
    print(f"{what}: {len(pkt)} bytes, dcpxd closed after {ts[len(ts)//2]*1e3:.2f} ms median ({ts[0]*1e3:.2f}-{ts[-1]*1e3:.2f})")
