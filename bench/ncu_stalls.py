#!/usr/bin/env python3
"""ncu_stalls.py - summarise Nsight Compute warp-state samples by source line.

Usage: python3 bench/ncu_stalls.py REPORT.csv [TOP] [SRCROOT]

REPORT.csv: `ncu -i X.ncu-rep --page source --csv --print-source cuda,sass`
(the gpu-run.sh steps prof2 and profmerge write it). Prints a Markdown
summary: total samples, the stall reasons over all lines, and the TOP
(default 25) source lines by samples with their top reasons. Source text is
read from SRCROOT (default: the repository this script lives in), matching
the report's file paths by their last two components (kernels/merge.cu).
"""
import csv
import os
import sys
from collections import Counter


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    root = sys.argv[3] if len(sys.argv) > 3 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    csv.field_size_limit(1 << 30)
    hdr, fpath = None, None
    lines = {}  # (file, line) -> [samples, instrs, Counter]
    for r in csv.reader(open(path, newline="")):
        if not r:
            continue
        if r[0] == "File Path":
            fpath = r[1]
            continue
        if r[0] == "Line No":
            hdr = r
            continue
        if hdr is None or len(r) != len(hdr) or not r[0].isdigit():
            continue
        row = dict(zip(hdr, r))
        try:
            smp = int(row["Warp Stall Sampling (All Samples)"])
        except ValueError:
            continue
        key = (fpath, int(r[0]))
        ent = lines.setdefault(key, [0, 0, Counter()])
        ent[0] += smp
        try:
            ent[1] += int(row["Instructions Executed"])
        except ValueError:
            pass
        for h in hdr:
            if h.startswith("stall_") and "(Not Issued)" not in h:
                try:
                    v = int(row[h])
                except ValueError:
                    continue
                if v:
                    ent[2][h[6:]] += v
    total = sum(e[0] for e in lines.values())
    instrs = sum(e[1] for e in lines.values())
    reasons = Counter()
    for e in lines.values():
        reasons.update(e[2])
    print(f"Samples: {total}; warp instructions executed: {instrs}.\n")
    print("Stall reasons, all lines: " + ", ".join(
        f"{k} {v} ({100 * v // max(total, 1)} %)"
        for k, v in reasons.most_common(10)) + "\n")
    print("| samples | share | warp instructions | file:line | source | top reasons |")
    print("|---:|---:|---:|---|---|---|")
    src_cache = {}
    for (f, ln), (smp, ins, rs) in sorted(lines.items(),
                                           key=lambda x: -x[1][0])[:top]:
        short = "/".join(f.split("/")[-2:]) if f else "?"
        if short not in src_cache:
            p = os.path.join(root, short)
            src_cache[short] = open(p).read().split("\n") if os.path.exists(p) else []
        src = src_cache[short]
        text = src[ln - 1].strip()[:70] if 0 < ln <= len(src) else ""
        text = text.replace("|", "\\|")
        why = ", ".join(f"{k} {v}" for k, v in rs.most_common(2))
        print(f"| {smp} | {100.0 * smp / max(total, 1):.1f} % | {ins} | "
              f"{short.split('/')[-1]}:{ln} | `{text}` | {why} |")


if __name__ == "__main__":
    main()
