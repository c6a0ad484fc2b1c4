#!/usr/bin/env python3
"""sass-cmp.py — whether a kernel refactor kept every kernel's machine code, without a GPU.

    cuobjdump -sass A1.o [A2.o ...] > before.sass     (the objects before the change)
    cuobjdump -sass B1.o [B2.o ...] > after.sass      (after it; any split into files)
    python3 bench/sass-cmp.py before.sass after.sass

cuobjdump comes from the nvidia-cuda-cuobjdump wheel and needs nvdisasm (the
nvidia-cuda-nvdisasm wheel) on PATH; bench/NOTES.md ("Kernel refactors without a
device") says how they are installed. The dumps are split into functions at their
`Function :` lines and compared on the instruction lines only (those with a `;`), with
the `/*0000*/` offsets dropped and runs of whitespace folded: cuobjdump pads its columns
to each file's longest line, so dumps of different files differ in spacing alone.
Prints the counts of functions that are the same, differ, or are on one side only, and
the demangled names of those that differ (c++filt). Exit status: 0 when every function
of both sides is the same, 1 otherwise.
"""
import re
import subprocess
import sys

OFFSET = re.compile(r"/\*[0-9a-f]{4,}\*/")


def functions(path):
    """The dump at path as {mangled name: its normalized instruction lines}."""
    funcs, name, lines = {}, None, []
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                if name:
                    funcs[name] = lines
                name, lines = m.group(1), []
            elif name and ";" in line:
                lines.append(re.sub(r"\s+", " ", OFFSET.sub("", line)).strip())
    if name:
        funcs[name] = lines
    return funcs


def demangle(names):
    """names demangled by c++filt (the names themselves when it is missing)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.split("\n")
        return out[: len(names)]
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    a, b = functions(argv[1]), functions(argv[2])
    same = [k for k in a if k in b and a[k] == b[k]]
    diff = [k for k in a if k in b and a[k] != b[k]]
    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    print(f"same {len(same)}  differ {len(diff)}  only before {len(only_a)}  "
          f"only after {len(only_b)}")
    for tag, names in (("differ", diff), ("only before", only_a), ("only after", only_b)):
        for n in demangle(names):
            print(f"  {tag}: {n[:160]}")
    return 0 if not (diff or only_a or only_b) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
