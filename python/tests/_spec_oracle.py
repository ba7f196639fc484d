"""_spec_oracle.py - one dcpx call computed from docs/PROTOCOL.md alone
(sections 2, 3 and 5), for test_spec_oracle.py.

Written in session 35 by a reader who had the protocol document and no
dcpx source: the local top-N lists through the wire form of section 3
(entry words, bit-16 plane), round 1 in flat order, saturation, T1 and
sat_word, rescue lists through the capacity-K form, round 2, and one
rank's outputs with the block-table rules of 5.7. Slow on purpose
(Python sets and sorts, no selection algorithm): it is an oracle for the
text, independent of common/ref.c and of the brute force in
tests/brute.h. Its agreement with dcpx_ref_call is the evidence that
the document says enough to build another implementation.
"""
import numpy as np


COV = {}
def cov(k):
    COV[k] = COV.get(k, 0) + 1


class SpecRange(Exception):
    pass


def isnan(b):
    return (b & 0x7FFF) > 0x7F80


def ord16(b):
    b = np.asarray(b, dtype=np.int64)
    return np.where(b & 0x8000, (~b) & 0xFFFF, b | 0x8000)


def next_e(e):
    return 1 if e >= 0xFFFFFFFE else e + 1


# ---- section 3: wire form -------------------------------------------------
def row_words(C):
    w = C + (C + 31) // 32
    return (w + 3) // 4 * 4


def encode(entries, C):
    """entries: list of (ord16, l) in ascending l, len <= C."""
    w = [0] * row_words(C)
    for j, (o, l) in enumerate(entries):
        w[j] = (o << 16) | (l & 0xFFFF)
        if (l >> 16) & 1:
            w[C + j // 32] |= 1 << (j % 32)
    return w


def decode(w, C):
    out = []
    for j in range(C):
        if w[j] == 0:
            out.append(None)
            continue
        bit = (w[C + j // 32] >> (j % 32)) & 1
        out.append((w[j] >> 16, (w[j] & 0xFFFF) | (bit << 16)))
    return out


# ---- section 2: local top-C list -----------------------------------------
def local_list(row, end, C, t1=None):
    """Local top-C list (ascending l), as (ord16, l) pairs; optionally filtered by ord16 >= t1."""
    b = np.asarray(row[:end], dtype=np.int64)
    l = np.arange(end, dtype=np.int64)
    ok = ~isnan(b)
    o = ord16(b)[ok]
    l = l[ok]
    idx = np.lexsort((l, -o))[:C]   # best first: ord desc, l asc
    sel_l = np.sort(l[idx])
    sel_o = ord16(np.asarray(row, dtype=np.int64)[sel_l]) if len(sel_l) else np.zeros(0, np.int64)
    ent = [(int(a), int(c)) for a, c in zip(sel_o, sel_l)]
    if t1 is not None:
        ent = [e for e in ent if e[0] >= t1]
    return ent


def topk_keys(keys, K):
    """keys: list of (ord16, r, l) in flat order; returns set of selected indices into keys."""
    if not keys:
        return []
    o = np.array([k[0] for k in keys], np.int64)
    r = np.array([k[1] for k in keys], np.int64)
    l = np.array([k[2] for k in keys], np.int64)
    idx = np.lexsort((l, r, -o))[:K]
    return sorted(idx.tolist())


def gid(l, r, W, I):
    return (l // I) * I * W + r * I + l % I


def merge_row(logits, ends, t, W, K, N, given=None):
    """Returns (result keys list [(ord, r, l)] in (r,l) order, mask, T1, nsat)."""
    # push: each rank's local top-N list, through the wire form
    lists = []
    for r in range(W):
        if given is not None and given[r] is not None:
            vals, idxs = given[r]
            ent = [(int(ord16(int(vals[t][j]))), int(idxs[t][j])) for j in range(N) if idxs[t][j] >= 0]
        else:
            ent = local_list(logits[r][t], int(ends[r][t]), N)
        w = encode(ent, N)
        assert len(w) == row_words(N)
        dec = decode(w, N)
        lists.append(dec)
    # 5.1 round 1
    keys = []
    for r in range(W):
        for j, e in enumerate(lists[r]):
            if e is None:
                continue
            keys.append((e[0], r, e[1]))
    sel = topk_keys(keys, K)
    S1 = set(keys[i] for i in sel)
    count = len(S1)
    # 5.2 saturation
    mask = 0
    for r in range(W):
        ent = [e for e in lists[r] if e is not None]
        if len(ent) == N and all((e[0], r, e[1]) in S1 for e in ent):
            mask |= 1 << r
    # 5.3
    if count == K:
        T1 = min(k[0] for k in S1)  # K-th best key's ord16 = the minimum ord16 among S1
    else:
        T1 = 0
    if any(k[2] >= 65536 for k in S1): cov('S1_l>=65536')
    if mask == 0:
        cov('row_nomask')
        result = sorted(S1, key=lambda k: (k[1], k[2]))
        return result, mask, T1, 0
    # 5.4 rescue lists (through the wire form, capacity K)
    rescue = {}
    for s in range(W):
        if mask >> s & 1:
            ent = local_list(logits[s][t], int(ends[s][t]), K, t1=T1)
            w = encode(ent, K)
            dec = decode(w, K)
            c = next((j for j, e in enumerate(dec) if e is None), K)
            rescue[s] = [e for e in dec[:c]]
            cov('rescue_c<K' if c < K else 'rescue_c=K')
            if c == 0: cov('rescue_c=0')
    # 5.5 round 2
    keys2 = []
    for r in range(W):
        if mask >> r & 1:
            for e in rescue[r]:
                keys2.append((e[0], r, e[1]))
        else:
            for e in lists[r]:
                if e is not None and (e[0], r, e[1]) in S1:
                    keys2.append((e[0], r, e[1]))
    sel2 = topk_keys(keys2, K)
    result = [keys2[i] for i in sel2]
    cov('row_mask'); cov('mask_T1=0' if T1 == 0 else 'mask_T1>0')
    if len(result) < K: cov('r2_lt_K')
    if any(k[2] >= 65536 for k in result if (mask >> k[1]) & 1): cov('rescued_l>=65536')
    return result, mask, T1, bin(mask).count("1")


def call(W, K, N, B, I, rows, logits, ends, d, req_id, bt, given=None):
    """bt: 2-D int array [bt_rows][bt_cols]. Returns dict of outputs, or raises SpecRange."""
    bt_rows, bt_cols = bt.shape
    rows_out = np.full((rows, K), -1, np.int64)
    valid_out = np.zeros(rows, np.int64)
    ids_out = np.full((rows, K), -1, np.int64)
    sat = np.zeros(rows, np.int64)
    stats = [0, 0, 0]
    bad = False
    for t in range(rows):
        res, mask, T1, nsat = merge_row(logits, ends, t, W, K, N, given)
        sat[t] = (mask << 16) | T1
        stats[0] += 1
        if mask:
            stats[1] += 1
        stats[2] += nsat
        for i, (o, r, l) in enumerate(res):
            ids_out[t, i] = gid(l, r, W, I)
        own = [l for (o, r, l) in res if r == d]
        rq = int(req_id[t])
        rowbad = not (0 <= rq < bt_rows)
        kv = []
        if not rowbad:
            for l in own:
                col = l // B
                if col >= bt_cols:
                    rowbad = True
                    break
                blk = int(bt[rq, col])
                if blk < 0:
                    rowbad = True
                    break
                v = blk * B + l % B
                if v > 2**31 - 1:
                    rowbad = True
                    break
                kv.append(v)
        if rowbad:
            cov('rowbad')
            bad = True
            valid_out[t] = -1
        else:
            rows_out[t, :len(kv)] = kv
            valid_out[t] = len(kv)
    if bad:
        raise SpecRange(valid_out)
    return dict(rows_out=rows_out, valid_out=valid_out, ids_out=ids_out, sat_word=sat, stats=stats)
