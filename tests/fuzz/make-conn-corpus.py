#!/usr/bin/env python3
"""make-conn-corpus.py - writes the seed corpus of tests/fuzz/fuzz_conn:
sessions of dcpx frames (proto/dcpx.proto, encoded here by hand) over up to
four connections, in fuzz_conn.c's record format.

    python3 tests/fuzz/make-conn-corpus.py tests/fuzz/corpus/conn
"""
import os
import sys


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def zigzag(v):
    return (v << 1) ^ (v >> 63)


def f_varint(num, v):
    return varint(num << 3) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def frame(case, body):
    return f_bytes(case, body)


def hello(version=1):
    return frame(1, f_varint(1, version) + f_bytes(2, "fuzz"))


def shape(world=1, rows=2, topk=16, local_topk=4, block=4, inter=2,
          max_local=64):
    return (f_varint(1, world) + f_varint(2, rows) + f_varint(3, topk) +
            f_varint(4, local_topk) + f_varint(5, block) + f_varint(6, inter) +
            f_varint(7, max_local))


def join(group, world=1, rank=0, reattach=False, generation=0,
         timeout_ms=500, **kw):
    body = (f_bytes(1, group) + f_bytes(2, shape(world, **kw)) +
            f_varint(4, 5_000_000_000) + f_varint(5, rank) +
            f_varint(6, zigzag(-1)) + f_bytes(7, "node") +
            f_varint(9, timeout_ms))
    if reattach:
        body += f_varint(11, 1) + f_varint(12, generation)
    return frame(3, body)


def leave():
    return frame(5, b"")


def ack(generation):
    return frame(7, f_varint(1, generation))


def query(what, group="", rank=-1):
    return frame(8, f_varint(1, what) + f_bytes(2, group) +
                 f_varint(3, zigzag(rank)))


def command(kind, group, rank=0, ticks=1_000_000):
    return frame(10, f_varint(1, kind) + f_bytes(2, group) +
                 f_varint(3, zigzag(rank)) + f_varint(6, ticks))


def rec(conn, packet, nfds=0):
    if len(packet) > 0xFFFF:  # a third length byte (fuzz_conn.c's bit 5)
        return bytes([conn | nfds << 2 | 0x20]) + \
            len(packet).to_bytes(3, "little") + packet
    return bytes([conn | nfds << 2]) + len(packet).to_bytes(2, "little") + \
        packet


def close(conn):
    return bytes([0x80 | conn, 0, 0])


SESSIONS = {
    # one rank: a group forms at once; every query; leave
    "solo": [rec(0, hello()), rec(0, join("g1")),
             rec(0, query(1)), rec(0, query(2, "g1")), rec(0, query(3)),
             rec(0, query(4, "g1", 0)), rec(0, leave())],
    # two ranks on two connections; reset, acks, fault; a rank goes
    "pair": [rec(0, hello()), rec(1, hello()),
             rec(0, join("g2", world=2, rank=0)),
             rec(1, join("g2", world=2, rank=1)),
             rec(2, hello()), rec(2, command(1, "g2")),
             rec(0, ack(1)), rec(1, ack(1)),
             rec(2, command(2, "g2", rank=1)),
             rec(2, query(2, "g2")), close(1),
             rec(3, hello()), rec(3, join("g2", world=2, rank=1)),
             rec(0, leave())],
    # a reattach with descriptors (refused: no secret), then mismatches
    "reattach": [rec(0, hello()),
                 rec(0, join("g3", reattach=True, generation=1), nfds=2),
                 rec(1, hello()), rec(1, join("g3", world=2, rank=0)),
                 rec(2, hello()), rec(2, join("g3", world=3, rank=1)),
                 rec(2, join("g3", world=2, rank=0))],
    # protocol errors: no Hello, bad version, two Hellos, stray fds
    "errors": [rec(0, query(1)), rec(1, hello(99)),
               rec(2, hello()), rec(2, hello()),
               rec(3, hello(), nfds=3), rec(3, leave()),
               rec(3, ack(7)), rec(3, b"\xff\xff\xff")],
    # packets past 64 KiB: a QueryReply of 35,000 empty Records (a
    # message of the other direction, refused before it is unpacked), a
    # Query holding 35,000 empty fields 3 (unpacked, then refused)
    "big": [rec(0, hello()), rec(0, frame(9, b"\x1a\x00" * 35000)),
            rec(1, hello()), rec(1, frame(8, b"\x1a\x00" * 35000)),
            rec(2, hello()), rec(2, query(1))],
    # a forming group left half-joined, then a join on the same conn
    "forming": [rec(0, hello()), rec(0, join("g4", world=4, rank=2)),
                rec(0, join("g5")), rec(1, hello()),
                rec(1, join("g4", world=4, rank=2)), close(0),
                rec(1, query(1, "g4"))],
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/conn"
    os.makedirs(out, exist_ok=True)
    for name, recs in SESSIONS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(b"".join(recs))


if __name__ == "__main__":
    main()
