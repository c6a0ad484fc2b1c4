#!/usr/bin/env python3
"""ncu-steps.py — where a decode step's GPU time goes, from an ncu CSV log.

    ncu --clock-control none --cache-control none --print-units base --csv \
        --metrics gpu__time_duration.sum --log-file k.csv  tpinfer bench -p 0 -n N ...
    python3 bench/ncu-steps.py k.csv N [STEP_TIME_US]

ncu runs each kernel alone (graph nodes one by one), so the sums are the kernels'
own durations without the gaps between them and without the overlap of forked
streams; STEP_TIME_US (1e6 / the bench's t/s) shows what is left for the gaps.
Prints, per kernel name (template arguments cut), launches per step, mean us and
us per step, largest first, then the totals.
"""
import csv
import re
import sys
from collections import OrderedDict


def short(name):
    name = re.sub(r"\(.*$", "", name)  # argument list
    # keep one level of template arguments, shortened: kinds and types matter
    m = re.match(r"^(?:void\s+)?([\w:]+)(<.*>)?$", name.strip())
    if not m:
        return name[:80]
    base, tmpl = m.group(1), m.group(2) or ""
    tmpl = re.sub(r"\s+", "", tmpl)
    return (base + tmpl)[:90]


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: ncu-steps.py LOG.csv N_STEPS [STEP_TIME_US]")
    path, n_steps = sys.argv[1], int(sys.argv[2])
    step_us = float(sys.argv[3]) if len(sys.argv) > 3 else None
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    tot = OrderedDict()
    seq = []
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            v = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        unit = r.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
        us = v * scale
        k = short(r["Kernel Name"])
        c = tot.setdefault(k, [0, 0.0])
        c[0] += 1
        c[1] += us
        seq.append((k, us))
    if not seq:
        sys.exit("ncu-steps.py: no gpu__time_duration rows in %s" % path)
    all_us = sum(c[1] for c in tot.values())
    print("kernels: %d launches, %.1f us in all, %d steps -> %.1f us of kernel time per step"
          % (len(seq), all_us, n_steps, all_us / n_steps))
    if step_us:
        print("step time %.1f us: %.1f us per step (%.0f %%) outside kernel durations"
              % (step_us, step_us - all_us / n_steps, 100 * (1 - all_us / n_steps / step_us)))
    print("%8s %9s %10s %6s  %s" % ("n/step", "mean us", "us/step", "share", "kernel"))
    for k, (n, us) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
        print("%8.1f %9.2f %10.1f %5.1f%%  %s"
              % (n / n_steps, us / n, us / n_steps, 100 * us / all_us, k))
    # the last step's launches in order, consecutive repeats folded, for the layer pattern
    per = len(seq) // n_steps
    tail = seq[-per:]
    print("\nlast %d launches in order (first 40):" % per)
    for k, us in tail[:40]:
        print("   %8.2f  %s" % (us, k))


if __name__ == "__main__":
    main()
