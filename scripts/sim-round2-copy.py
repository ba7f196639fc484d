# sim-round2-copy.py - the index arithmetic of round2_copy (kernels/merge.cu,
# this branch) against the old compaction's result, in Python, over random
# W, N, K, saturation masks and S1 selections: python3 scripts/sim-round2-copy.py
# prints ok (no GPU needed; the kernel itself is checked by gpu-run.sh kernels).
import random
def pad4(x): return (x+3)&~3
MAXW=16
for it in range(20000):
    W=random.randint(1,16); N=random.randint(1,300); K=random.randint(N+1, N*W+50)
    # k1 words: nonzero keys; S1 selection per rank: choose subset
    k1=[[random.randint(1,0xFFFFFFFF) for j in range(N)] for s in range(W)]
    sel=[]; mask=0
    for s in range(W):
        if random.random()<0.3: idx=list(range(N)); mask|=1<<s
        else:
            c=random.randint(0,N-1); idx=sorted(random.sample(range(N),c))
        sel.append(idx)
    # s1k in output (rank-major) order, bound
    s1k=[]; bound=[0]
    for s in range(W):
        s1k += [k1[s][j] for j in sel[s]]; bound.append(len(s1k))
    sizes=[pad4(K if (mask>>s)&1 else bound[s+1]-bound[s]) for s in range(W)]
    off2=[0]
    for z in sizes: off2.append(off2[-1]+z)
    n2=off2[W]
    # expected (old semantics): non-saturated segments = S1 keys then zeros; saturated: own/poll writes j<K, zeros j>=K
    SENT=object()
    exp=[SENT]*n2
    for s in range(W):
        o=off2[s]
        if (mask>>s)&1:
            for j in range(K, sizes[s]): exp[o+j]=0
        else:
            words=[k1[s][j] for j in sel[s]]
            for j in range(sizes[s]): exp[o+j]=words[j] if j<len(words) else 0
    got=[SENT]*n2
    for x in range(0,n2,4):
        s=0; step=MAXW//2
        while step:
            if s+step<W and off2[s+step]<=x: s+=step
            step//=2
        j=x-off2[s]
        if (mask>>s)&1:
            for u in range(4):
                if j+u>=K: got[x+u]=0
            continue
        b=bound[s]; cnt=bound[s+1]-b
        for u in range(4): got[x+u]= s1k[b+j+u] if j+u<cnt else 0
    assert got==exp, (W,N,K,mask)
print("ok")
