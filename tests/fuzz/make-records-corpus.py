#!/usr/bin/env python3
"""make-records-corpus.py - writes the seed corpus of tests/fuzz/fuzz_records:
dcpxd records files (daemon/dcpxd-records.c: 128-byte entries, the awaited
rank + 1 at bytes 120..123, a CRC-32 of bytes 0..123 at 124) in
fuzz_records.c's input format.

    python3 tests/fuzz/make-records-corpus.py tests/fuzz/corpus/records
"""
import os
import struct
import sys
import zlib

MAX_WORLD = 16  # DCPX_MAX_WORLD


def entry(t, awaited_word, group=b"g", rank=0, region=1):
    e = struct.pack("<IHH", 0x52504344, 1, 128)
    e += group.ljust(64, b"\0")[:64]
    e += struct.pack("<8I", 1, rank, 1, region, 7, 1, 0, 2)
    e += struct.pack("<QQ", 1000 + t, t)
    e += struct.pack("<I", awaited_word)
    return e + struct.pack("<I", zlib.crc32(e) & 0xFFFFFFFF)


def session(flags, old, live):
    return bytes([flags]) + struct.pack("<H", len(old)) + old + live


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    words = [0, 1, 4, MAX_WORLD, MAX_WORLD + 1, 0xFFFFFFFF]
    both = b"".join(entry(t, w) for t, w in enumerate(words))
    seeds = {
        # entries an older dcpxd wrote (0: unknown) and a newer one's
        "old-and-new": session(1, entry(0, 0) + entry(1, 0),
                               entry(2, 3) + entry(3, MAX_WORLD)),
        # every kind of stored word, out of range ones included
        "awaited-words": session(1, b"", both),
        # a damaged entry and a torn tail, a small ring and max_bytes
        "damaged": session(4, both[:128],
                           both[128:200] + b"\xa5" * 56 + both[256:] +
                           both[:77]),
        "garbage": session(2, b"\0" * 300, bytes(range(256)) * 2),
        # entries whose CRC the target makes good (flag 8): their fields,
        # the awaited word at 120 included, are what the fuzzer mutates
        "crc-fixed": session(8 | 1, b"", both),
        "empty": session(0, b"", b""),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
