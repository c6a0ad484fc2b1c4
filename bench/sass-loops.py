#!/usr/bin/env python3
"""sass-loops.py — the instructions of a kernel's loops, counted by opcode, without a GPU.

    cuobjdump -sass part.cubin > part.sass
    python3 bench/sass-loops.py part.sass PREFIX [N]

For the first function whose mangled name starts with PREFIX (a `Function :` line of the
dump; e.g. _Z15gv_quant_kernelILi12ELi1ELb1ELi1E, Q4_K's one-row kernel), prints its
instruction count and its N longest loops (default 3): a loop is the span from a
backward branch's target to the branch, and each is given as its instruction count and
the opcodes in it, most frequent first (the opcode's first part: IMAD.WIDE counts as
IMAD, predicated instructions as their opcode). How the project uses it (instructions
a weight byte of each loop, before and after a change to a dot): bench/NOTES.md changes
139 and 140. Compile one part on its own for it, e.g.
    nvcc -DTPI_HAVE_CUDA=1 -Iengine -Iloaders -I. -O3 -DNDEBUG -arch=sm_90 -cubin \\
        --expt-relaxed-constexpr [-DKNOB=1] -o part.cubin engine/kernels/kern_gemv_k.cu
and `cuobjdump -res-usage part.cubin` gives the registers. Exit status: 0; 1 when no
function matches; 2 without the arguments.
"""
import collections
import re
import sys

OFFSET = re.compile(r"/\*([0-9a-f]{4,})\*/\s+\S")
BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)? 0x([0-9a-f]+)")
OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def function(path, prefix):
    """The first function of the dump at path whose name starts with prefix: (name,
    its instruction lines), or None."""
    with open(path) as f:
        parts = re.split(r"\n\s*Function : ", f.read())
    for part in parts[1:]:
        name = part.split("\n", 1)[0].strip()
        if name.startswith(prefix):
            return name, [l for l in part.split("\n") if OFFSET.search(l)]
    return None


def loops(lines):
    """(length, first, last) of every backward branch's span, longest first."""
    at = [int(OFFSET.search(l).group(1), 16) for l in lines]
    index = {a: i for i, a in enumerate(at)}
    found = []
    for i, l in enumerate(lines):
        m = BRANCH.search(l)
        if m:
            target = int(m.group(1), 16)
            if target < at[i] and target in index:
                j = index[target]
                found.append((i - j + 1, j, i))
    return sorted(found, reverse=True)


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    got = function(argv[1], argv[2])
    if got is None:
        print(f"sass-loops: no function in {argv[1]} starts with {argv[2]}", file=sys.stderr)
        return 1
    name, lines = got
    print(f"{name}: {len(lines)} instructions")
    for n, j, i in loops(lines)[: int(argv[3]) if len(argv) > 3 else 3]:
        ops = collections.Counter(OPCODE.search(l).group(1).split(".")[0] for l in lines[j : i + 1])
        print(f"  loop of {n}: " + " ".join(f"{op} {c}" for op, c in ops.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
