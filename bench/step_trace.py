#!/usr/bin/env python3
"""step_trace.py — a decode step's kernel timeline from bench/step_trace.c's records.

Reads the TSV that libstep_trace.so wrote (start, end, grid blocks, block threads,
graph node, mangled name; device ns), cuts the process's kernels into bursts at
host-side gaps (a decode step is one graph launch: its kernels follow each other
within a few microseconds), keeps the bursts of the most common kernel count among
the long ones (the decode steps of a tg run), and prints:
  - the step's wall time (first start to last end) and the gap between steps;
  - per kernel role (short name and grid size), how often it runs a step, its median
    duration, the median gap between the previous kernel's end and its start (negative:
    it started before the previous one ended, PDL's overlap), and its median
    increment: how far it moved the chain's end (end minus the previous kernels' latest
    end). The increments of a step sum to its wall time, so they are each role's share;
  - one layer's kernels in order (the layer in the middle of the step) with the same
    columns.

usage: step_trace.py TRACE.tsv [--gap-us 8] [--min-kernels 100] [--last N]
"""
import argparse
import re
import statistics
import sys


def short_name(mangled):
    """A readable name: the function's identifier and its template's integer arguments."""
    m = re.match(r"_Z(\d+)(\w+)", mangled)
    if not m:
        return mangled[:60]
    n = int(m.group(1))
    ident = m.group(2)[:n]
    rest = m.group(2)[n:]
    args = []
    if rest.startswith("I"):
        for a in re.finditer(r"L(?:i|b|j|l|m)(n?\d+)E", rest):
            args.append(a.group(1).replace("n", "-"))
            if len(args) >= 6:
                break
    return ident + ("<" + ",".join(args) + ">" if args else "")


def load(path):
    """The kernel records, sorted by start, and apart from them the copies and host calls
    (STEP_TRACE_MEMCPY=1, STEP_TRACE_API=1) as (start, end, bytes, name)."""
    recs, copies = [], []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) < 6:
                continue
            if p[5].startswith("memcpy_") or p[5].startswith("api_"):  # start, end, bytes, kind
                copies.append((int(p[0]), int(p[1]), int(p[2]), p[5]))
                continue
            recs.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), short_name(p[5])))
    recs.sort()
    copies.sort()
    return recs, copies


def bursts(recs, gap_ns):
    """The records (sorted by start) cut wherever a kernel starts more than gap_ns after
    every earlier kernel of its burst has ended."""
    out, cur, last_end = [], [], 0
    for r in recs:
        if cur and r[0] - last_end > gap_ns:
            out.append(cur)
            cur = []
        if not cur:
            last_end = r[1]
        cur.append(r)
        last_end = max(last_end, r[1])
    if cur:
        out.append(cur)
    return out


def totals(recs, copies, gap_ns, top):
    """The whole process's kernel time by name (the --totals report)."""
    span = recs[-1][1] - recs[0][0]
    busy, front, lo = 0, recs[0][0], recs[0][0]
    agg = {}
    for r in recs:
        if r[0] > front:  # an idle stretch: the union restarts here
            busy += front - lo
            lo = r[0]
        inc = max(r[1], front) - max(r[0], front)
        front = max(front, r[1])
        g = agg.setdefault(r[4], [0, 0, 0])
        g[0] += 1
        g[1] += r[1] - r[0]
        g[2] += inc
    busy += front - lo
    bs = bursts(recs, gap_ns)
    gl = [(max(r[1] for r in bs[i]), bs[i + 1][0][0]) for i in range(len(bs) - 1)]  # the gaps
    gaps = [b - a for a, b in gl]
    print(f"{len(recs)} kernels; span {span / 1e6:.2f} ms, a kernel running {busy / 1e6:.2f} ms "
          f"({100 * busy / span:.1f} %)")
    if gaps:
        print(f"{len(bs)} bursts (gap > {gap_ns / 1e3:.0f} us): gaps sum {sum(gaps) / 1e6:.2f} ms, "
              f"median {statistics.median(gaps) / 1e3:.1f} us")
    print(f"\n{'launches':>9} {'dur ms':>9} {'inc ms':>9} {'share':>6}  kernel (share of the union)")
    for k, g in sorted(agg.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"{g[0]:9d} {g[1] / 1e6:9.2f} {g[2] / 1e6:9.2f} {100 * g[2] / busy:5.1f}%  {k}")
    if copies:
        # each copy's or host call's time, and the part of it inside the gaps between bursts
        print(f"\n{'n':>9} {'ms':>9} {'in gaps':>9} {'MB':>10} {'GB/s':>7}  copy "
              f"(STEP_TRACE_MEMCPY=1) or host call (STEP_TRACE_API=1)")
        ck = {}
        gi = 0
        for c in copies:
            g = ck.setdefault(c[3], [0, 0, 0, 0])
            g[0] += 1
            g[1] += c[1] - c[0]
            g[2] += max(c[2], 0)
            while gi < len(gl) and gl[gi][1] <= c[0]:
                gi += 1
            j = gi
            while j < len(gl) and gl[j][0] < c[1]:
                g[3] += max(0, min(c[1], gl[j][1]) - max(c[0], gl[j][0]))
                j += 1
        for k, g in sorted(ck.items(), key=lambda kv: -kv[1][3])[:top]:
            rate = f"{g[2] / max(g[1], 1):7.1f}" if k.startswith("memcpy_") else f"{'':7}"
            print(f"{g[0]:9d} {g[1] / 1e6:9.2f} {g[3] / 1e6:9.2f} {g[2] / 1e6:10.1f} {rate}  {k}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--gap-us", type=float, default=8.0)
    ap.add_argument("--min-kernels", type=int, default=100)
    ap.add_argument("--last", type=int, default=0, help="only the last N steps (0: all)")
    ap.add_argument("--totals", action="store_true", help="the whole process's shares by kernel")
    ap.add_argument("--top", type=int, default=30, help="--totals: the N largest kernels")
    a = ap.parse_args()
    recs, copies = load(a.trace)
    if not recs:
        sys.exit(f"{a.trace}: no kernel records")
    if a.totals:
        totals(recs, copies, int(a.gap_us * 1000), a.top)
        return
    bs = [b for b in bursts(recs, int(a.gap_us * 1000)) if len(b) >= a.min_kernels]
    if not bs:
        sys.exit(f"{a.trace}: no burst of {a.min_kernels} or more kernels")
    counts = {}
    for b in bs:
        counts[len(b)] = counts.get(len(b), 0) + 1
    n_k = max(counts, key=lambda k: (counts[k], k))
    steps = [b for b in bs if len(b) == n_k]
    if a.last:
        steps = steps[-a.last:]
    walls = [b[-1][1] - b[0][0] for b in steps]
    gaps = [steps[i + 1][0][0] - max(r[1] for r in steps[i]) for i in range(len(steps) - 1)]
    print(f"{len(recs)} kernels, {len(bs)} bursts of >= {a.min_kernels}; {len(steps)} steps of "
          f"{n_k} kernels")
    print(f"step wall (first start to last end): median {statistics.median(walls) / 1e3:.1f} us; "
          f"gap to the next step: median {statistics.median(gaps) / 1e3 if gaps else 0:.1f} us")
    # per position: duration, gap after the previous end, increment of the chain's end
    dur = [[] for _ in range(n_k)]
    gap = [[] for _ in range(n_k)]
    inc = [[] for _ in range(n_k)]
    for b in steps:
        front = b[0][0]
        for i, r in enumerate(b):
            dur[i].append(r[1] - r[0])
            gap[i].append(r[0] - front if i else 0)
            inc[i].append(max(r[1], front) - front if i else r[1] - r[0])
            front = max(front, r[1])
    role = [f"{r[4]} [{r[2]}x{r[3]}]" for r in steps[-1]]
    med = lambda v: statistics.median(v) / 1e3
    agg = {}
    for i in range(n_k):
        g = agg.setdefault(role[i], [0, [], [], 0.0])
        g[0] += 1
        g[1].append(med(dur[i]))
        g[2].append(med(gap[i]))
        g[3] += med(inc[i])
    total = sum(g[3] for g in agg.values())
    print(f"\nper role (a step: {total:.1f} us of increments)")
    print(f"{'n':>4} {'dur us':>8} {'gap us':>8} {'inc us/step':>12} {'share':>6}  role")
    for k, g in sorted(agg.items(), key=lambda kv: -kv[1][3]):
        print(f"{g[0]:4d} {statistics.median(g[1]):8.2f} {statistics.median(g[2]):8.2f} "
              f"{g[3]:12.1f} {100 * g[3] / total:5.1f}%  {k}")
    # one layer in the middle: from one attention launch to the next (else the period of
    # the middle kernel's name)
    names = [r[4] for r in steps[-1]]
    attn = [nm for nm in names if "attn" in nm]
    first = attn[0] if attn else names[len(names) // 2]
    idx = [i for i, nm in enumerate(names) if nm == first]
    mid = [i for i in idx if i >= len(names) // 2]
    if len(mid) >= 2:
        lo, hi = mid[0], mid[1]
        print(f"\none layer (positions {lo}..{hi - 1})")
        print(f"{'pos':>4} {'dur us':>8} {'gap us':>8} {'inc us':>8}  role")
        for i in range(lo, hi):
            print(f"{i:4d} {med(dur[i]):8.2f} {med(gap[i]):8.2f} {med(inc[i]):8.2f}  {role[i]}")
    print(f"\nlast positions of the step")
    for i in range(max(0, n_k - 4), n_k):
        print(f"{i:4d} {med(dur[i]):8.2f} {med(gap[i]):8.2f} {med(inc[i]):8.2f}  {role[i]}")


if __name__ == "__main__":
    main()
