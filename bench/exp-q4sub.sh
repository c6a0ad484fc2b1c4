#!/bin/bash
# Changes 138-140's measurement (branch exp/q4-sub, bench/NOTES.md), in three device calls
# on one held machine (each ~5-7 min with the start):
#   PART=A: the branch's default build (build/: change 138's rings and change 139's
#     three-instruction offsets, TPI_GV_SUB=1) with tpinfer, test_gemv_cuda and
#     test_ops_fused, and build-sub0/ (TPI_GV_SUB=0: __vsub4, change 138 alone) with
#     tpinfer; test_gemv_cuda of every type with an offset, api; bench/ab.sh of main
#     (carried: $BIN_DIR/tpinfer-main.xz, default .dev/q4r) against both on the 8B Q4_0
#     and on the 8B Q4_K_M (Q6_K's offsets) at depths 0 and 8192; test_ops_fused cuda.
#   PART=B: Q4_0's other two forms (TPI_GV_Q40=1 and 2) built in build-q40-1/2 with
#     tpinfer and test_gemv_cuda; their test_gemv_cuda Q4_0, and bench/ab.sh of build/
#     against both on the 8B Q4_0 (made again if the machine was not kept).
#   PART=C: change 140 (the same bits): build-walk (TPI_GV_WALK=1: gv_item_rows's
#     addresses walked by pointers, whole batches without the redo) and build-wq (with
#     TPI_GV_Q4K=1 and TPI_GV_Q6S=1 too: Q4_K's high nibbles in place and its scales by
#     byte permutes, Q6_K's groups' values without the offset and x's sum taken off);
#     build-pad (TPI_GV_PAD=32: 32 instructions more an item, a measurement only);
#     build-wq's test_gemv_cuda of Q4_K, Q6_K and Q8_0 and test_ops_fused cuda (the rings
#     bitwise the one-row kernels); bench/ab.sh of build/ against the three on the 8B
#     Q4_K_M (depths 0 and 8192, 4 rounds), and against build-walk on the 8B Q8_0 (depth 0).
#   PART=D: run 232's lead, Q4_K's and Q6_K's dots of change 140 (TPI_GV_Q4K=1 and
#     TPI_GV_Q6S=1) on the default's addresses, without TPI_GV_WALK: that build made on the
#     CPU machine (90-real, stripped) and carried as $BIN_DIR/tpinfer-q.xz (default
#     .dev/q4d); bench/ab.sh of build/ against it on the 8B Q4_K_M (depths 0 and 8192, 4
#     rounds; the greedy bytes checked as every ab.sh run does); main's tpinfer as well
#     where .dev/q4r is carried (PART=A's Q4_K_M pair: one call for the goal's model).
#   PART=M: the merge candidate (branch merge-141: changes 139 and 141 the defaults, change
#     138's Q4_0 rings left out): every target built, `ctest -L gpu -E "parallel|comm"`,
#     then bench/ab.sh of main (.dev/q4r) against it, 2 rounds, on the 8B Q4_K_M (depths 0
#     and 8192) and the 8B Q4_0 (depth 0). ~4.5 min on a fresh machine.
#   PART=T: PART=M's tests alone, for a call with little device time: test_gemv_cuda of
#     every type the change touches and test_ops_fused cuda (~2 min on a fresh machine).
#   PART=R: change 142 (branch q4-ring: change 138's Q4_0 rings on main, gv_ring1_kernel
#     keeping the one-row kernel's split of a row over 2 warps): every target built,
#     `ctest -L gpu -E "parallel|comm"` (main's own changes 139 and 141 checked with it),
#     build-r0 (TPI_GV_Q40RING=0: this main without the Q4_0 rings) built beside it;
#     bench/ab.sh, 2 rounds: main before 139/141 (.dev/q4r), r0 and the branch on the 8B
#     Q4_0 (depth 0), main before and the branch on the 8B Q4_K_M (depths 0 and 8192).
#   PART=H: a commit's figures on this machine: MAIN_REV (default HEAD, which on the
#     device is the session's first commit) exported to /tmp/m and built there, `ctest -L
#     gpu -E "parallel|comm"` on it, the 8B models made, and the table: tg128 + pp512
#     (-r 3) of Q4_K_M, Q8_0, BF16 and Q4_0, depth 8192 of Q4_K_M and Q8_0 (-r 2); its
#     tpinfer kept as /tmp/tpinfer-main, the tree's own build/ made beside the tests for
#     a comparison in the next call (TREE=0: not). ~6 min with the start.
#   PART=N: PART=H without the tree's build, then change 144's split (branch exp/ntail's
#     tpinfer, carried as $BIN_DIR/tpinfer.xz, default .dev/nt): bench/ab.sh on the 8B
#     Q4_K_M at depths 0 and 8192, 2 rounds, of MAIN_REV's tpinfer, the same with
#     TPI_DIAG_SKIP=norm, the branch's TPI_GEMV_NTAIL=2 (the default kernel in clusters of
#     8, no tail) and TPI_GEMV_NTAIL=1 (the tail). ~7-8 min with the start.
#   PART=P: change 145 (knobs only): MAIN_REV's tpinfer built, then bench/ab.sh on the 8B
#     Q4_K_M at depths 0 and 8192, 2 rounds: main, main with TPI_ATTN_DEC_CLUSTER=0 (the
#     decode attention's splits merged through global memory), main with PDL off
#     (TPI_PDL=0 TPI_GEMV_PDL=0), and exp/ntail's tpinfer (.dev/nt) at TPI_GEMV_NTAIL=2
#     with PDL off (does an 8-block cluster cost a one-wave launch its PDL overlap or its
#     placement?). ~4-5 min with the start.
#   PART=Q: change 143 (TPI_GEMV_Q40B=6|12, run 236, not merged: it builds only in a tree
#     with that code): build/, test_gemv_cuda host and Q4_0, then bench/ab.sh of MAIN_REV's
#     tpinfer (PART=H's, else built now) against the tree at q40b 0, 6 and 12 on the 8B
#     Q4_0 at depth 0, 4 rounds.
#   PART=S: where a depth-8192 step's time goes (run 240): MAIN_REV's tpinfer (PART=H's,
#     else built now), then bench/ab.sh on the 8B Q4_K_M at depths 8192 and 0, ROUNDS
#     (default 1): main, and main with TPI_DIAG_SKIP=attn, =norm and =norm,attn (outputs
#     wrong, timing only; no greedy check). After PART=H in the same call: ~1 min more.
#   PART=Y: the working tree against MAIN_REV (an engine change that should cost nothing):
#     the tree's every target built, `ctest -L gpu -E "parallel|comm"` on it while
#     MAIN_REV's tpinfer builds, then bench/ab.sh of main against the tree on the 8B
#     Q4_K_M at depths 0 and 8192, ROUNDS (default 2), greedy bytes checked. ~6 min.
#   PART=K: Q2_K, Q3_K and IQ4 on the GPU (change 147): the tree built, `ctest -L gpu -E
#     "parallel|comm"` (test_ops_cuda's matmul_Q3_K / _Q2_K / _IQ4_NL / _IQ4_XS / embed,
#     test_model_gpu on the three new tiny models among them), then `tpinfer bench` on the
#     8B in each of KTYPES (default q3_k_m iq4_xs q2_k; pp512, tg128, -r KR, default 1),
#     one at a time so a time limit keeps what finished. ~6 min.
#   PART=L: change 148, the types' own kernels (Q2_K, Q3_K, IQ4) on the GPU: the tree built,
#     `ctest -L gpu` of the types' tests (test_gemv_cuda's groups, test_ops_cuda,
#     test_ops_fused, test_model_gpu), MAIN_REV's tpinfer against the tree's by default and
#     with TPI_HOLD=0 on the 8B in each of KTYPES (default q3_k_m q2_k iq4_xs; bench/ab.sh
#     tg128 at depth 0, greedy bytes; then pp512). Run 249 (~10 min with KR=1) took it
#     when the tree held nothing (the own kernels are its "tree" lines). Since change 149
#     the pairs are MAIN_REV's own kernels (TPI_HOLD=0: the reference, whose greedy bytes
#     the tree's own must match), the tree's own (its default since change 149), and the
#     tree's held forms (TPI_HOLD=1); pp512 of both builds at TPI_HOLD 1 and 0 (MAIN_REV
#     before change 149 holds by default: for it TPI_HOLD=1 is the default). LCTEST=0 skips
#     the ctest, LPP=0 the pp512 lines (a call with little device time left).
#   PART=V: the own kernels and the held forms of Q3_K, Q2_K and IQ4 checked on the GPU,
#     for a call with little device time: the tree built, test_ops_cuda's matmul and embed
#     groups of those types and test_model_gpu on their three tiny models, each by default
#     and as _held (TPI_HOLD=1; before change 149 the held forms were the default and the
#     _own tests, at TPI_HOLD=0, the own kernels). ~4 min with the start.
#   PART=F: a last call of a session: on an H200 PART=L's tg128 pairs (KR rounds, default 1;
#     no ctest, no pp512) for iq4_xs and q3_k_m, the question change 149 left there (the
#     own kernels against the held forms); on any other card the tree's whole `ctest -L gpu
#     -E "parallel|comm"`. ~6 min with the start.
#   PART=G: change 151, Q3_K in 8-block groups (KERN_LAYOUT_Q3_KX8): the tree built, `ctest
#     -L gpu` of the kernels it touches (test_gemv_cuda's Q3_K, Q6_K and api groups,
#     test_ops_cuda, test_model_gpu, test_ops_fused) while MAIN_REV's tpinfer builds, the
#     one-row microbench of Q3_K at the 8B's shapes with TPI_Q3_REPACK 0 and 1, then
#     bench/ab.sh on the 8B Q3_K_M at depth 0 (KR rounds, default 2; greedy bytes): main,
#     the tree, the tree at TPI_Q3_REPACK=0; pp512 of main and the tree. ~7 min.
#   PART=W: change 151b, after run 255 (the groups -1.9 % on the 8B Q3_K_M though every
#     one-row shape ran faster): the tree's tpinfer and the two tests that run its gate/up
#     kernels (test_ops_fused cuda, test_gemv_cuda Q3_K), then bench/ab.sh on the 8B Q3_K_M
#     at depth 0 (KR rounds, default 2; greedy bytes against the first): GGUF's blocks
#     (TPI_Q3_REPACK=0), the groups (gate/up at 8 warps held to 3 blocks), the groups'
#     gate/up at 4 warps unbounded (TPI_GLU=4: run 255's), and gate/up as two one-row
#     products and silu_mul (TPI_GLU=0) with the groups and without. ~5 min.
# On main (after run 233): changes 139 and 141 are the code, and the knobs PART=A-C set
# (TPI_GV_WALK, TPI_GV_PAD, TPI_GV_Q40) and change 138's Q4_0 rings are gone; those parts
# build what they measured only on branch exp/q4-sub. PART=M and T check main itself.
# Logs under $OUT.
# shellcheck source=bench/gpu-lib.sh
. "$(dirname "$0")/gpu-lib.sh"
device_prep
export PATH=/usr/local/cuda/bin:$PATH
cfg() { # cfg DIR [CUDA_FLAGS]
    cmake -S . -B "$1" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
        ${2:+"-DCMAKE_CUDA_FLAGS=$2"} >>"$OUT/build.log" 2>&1
}
bld() { # bld DIR TARGET...
    local d=$1
    shift
    (time cmake --build "$d" -j 16 ${1:+--target "$@"}) >>"$OUT/build.log" 2>&1 ||
        { tail -20 "$OUT/build.log"; exit 1; }
    echo "built $d: $(grep real "$OUT/build.log" | tail -1)"
}
mk() { # mk TYPE: the 8B of TYPE at /tmp/TYPE.gguf, unless there (made by $MK_BIN)
    [ -s "/tmp/$1.gguf" ] || ${MK_BIN:-build/tpinfer} mkmodel --preset qwen3-8b --type "$1" -o "/tmp/$1.gguf" -q
}
main_at() { # main_at [TARGET...]: MAIN_REV (default HEAD) exported to /tmp/m, built there
    local rev=${MAIN_REV:-HEAD}
    git cat-file -e "$rev^{commit}" 2>/dev/null || { echo "no commit $rev here: main not built"; exit 1; }
    rm -rf /tmp/m && mkdir -p /tmp/m && git archive "$rev" | tar -C /tmp/m -xf - || exit 1
    (cd /tmp/m && cfg build && bld build "$@") || exit 1
    cp /tmp/m/build/tpinfer /tmp/tpinfer-main
    echo "main = $(git rev-parse --short "$rev"); the tree: $(git status --short | wc -l) files changed"
}
ab() { # ab TYPE NAME=BIN...
    local t=$1
    shift
    echo "== $t"
    MODEL=/tmp/$t.gguf DEPTHS="${ABD:-0 8192}" ROUNDS=${ROUNDS:-3} GREEDY_LENS="${GREEDY_LENS-300}" OUT="$OUT" \
        bash bench/ab.sh "$@" 2>&1 | grep -v "^d[0-9]* "
    cp "$OUT/ab.txt" "$OUT/ab-$t-$PART.txt" 2>/dev/null
}
case ${PART:-A} in
A)
    cfg build
    bld build tpinfer test_gemv_cuda test_ops_fused
    mk q4_0 &
    MP=$!
    for g in api Q4_0 Q5_0 Q6_K Q4_K Q8_0; do
        echo "gemv $g: $(build/tests/test_gemv_cuda $g 2>&1 | tail -1)"
    done
    cfg build-sub0 -DTPI_GV_SUB=0
    bld build-sub0 tpinfer
    wait $MP
    mk q4_k_m
    BIN_DIR=${BIN_DIR:-.dev/q4r} unxz tpinfer-main || exit 1
    ab q4_0 main=/tmp/tpinfer-main sub0=build-sub0/tpinfer sub=build/tpinfer
    ab q4_k_m main=/tmp/tpinfer-main sub=build/tpinfer
    build/tests/test_ops_fused cuda >"$OUT/fused.log" 2>&1
    echo "fused cuda rc=$?: $(tail -1 "$OUT/fused.log")"
    ;;
B)
    [ -x build/tpinfer ] || { cfg build; bld build tpinfer; }
    mk q4_0 &
    MP=$!
    for v in 1 2; do
        cfg build-q40-$v -DTPI_GV_Q40=$v
        bld build-q40-$v tpinfer test_gemv_cuda
        echo "q40=$v gemv Q4_0: $(build-q40-$v/tests/test_gemv_cuda Q4_0 2>&1 | tail -1)"
    done
    wait $MP
    ab q4_0 sub=build/tpinfer q40s=build-q40-1/tpinfer q40m=build-q40-2/tpinfer
    ;;
C)
    [ -x build/tpinfer ] || { cfg build; bld build tpinfer; }
    mk q4_k_m &
    MP=$!
    cfg build-walk -DTPI_GV_WALK=1
    bld build-walk tpinfer
    cfg build-wq "-DTPI_GV_WALK=1 -DTPI_GV_Q4K=1 -DTPI_GV_Q6S=1"
    bld build-wq tpinfer test_gemv_cuda test_ops_fused
    cfg build-pad -DTPI_GV_PAD=32
    bld build-pad tpinfer
    for g in Q4_K Q6_K Q8_0; do
        echo "wq gemv $g: $(build-wq/tests/test_gemv_cuda $g 2>&1 | tail -1)"
    done
    build-wq/tests/test_ops_fused cuda >"$OUT/fused-wq.log" 2>&1
    echo "wq fused cuda rc=$?: $(tail -1 "$OUT/fused-wq.log")"
    wait $MP
    echo "at ${SECONDS}s: ab"
    ROUNDS=4 ab q4_k_m sub=build/tpinfer walk=build-walk/tpinfer wq=build-wq/tpinfer \
        pad=build-pad/tpinfer
    echo "at ${SECONDS}s"
    # the Q8_0 pair only with time left in the call's 600 s (a fresh machine builds build/ too)
    [ "$SECONDS" -lt 470 ] || { echo "no time left for Q8_0"; exit 0; }
    mk q8_0
    ABD=0 ab q8_0 sub=build/tpinfer walk=build-walk/tpinfer
    ;;
D)
    [ -x build/tpinfer ] || { cfg build; bld build tpinfer; }
    BIN_DIR=${BIN_DIR:-.dev/q4d} unxz tpinfer-q || exit 1
    # main too where its binary came (.dev/q4r): PART=A's Q4_K_M pair in the same call
    M=()
    BIN_DIR=.dev/q4r unxz tpinfer-main 2>/dev/null && M=(main=/tmp/tpinfer-main)
    mk q4_k_m
    ROUNDS=4 ab q4_k_m "${M[@]}" sub=build/tpinfer q=/tmp/tpinfer-q
    ;;
T)
    cfg build
    bld build test_gemv_cuda test_ops_fused
    for g in api Q4_K Q5_K Q6_K Q4_0 Q5_0 Q8_0; do
        echo "gemv $g: $(build/tests/test_gemv_cuda $g 2>&1 | tail -1)"
    done
    build/tests/test_ops_fused cuda >"$OUT/fused.log" 2>&1
    echo "fused cuda rc=$?: $(tail -1 "$OUT/fused.log")"
    ;;
M)
    cfg build
    bld build
    (mk q4_k_m && mk q4_0) &
    MP=$!
    (cd build && time ctest -L gpu -E "parallel|comm" -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -8
    wait $MP
    BIN_DIR=${BIN_DIR:-.dev/q4r} unxz tpinfer-main || exit 1
    echo "at ${SECONDS}s: ab"
    ROUNDS=2 ab q4_k_m main=/tmp/tpinfer-main m=build/tpinfer
    ROUNDS=2 ABD=0 ab q4_0 main=/tmp/tpinfer-main m=build/tpinfer
    echo "at ${SECONDS}s"
    ;;
R)
    cfg build
    bld build
    (mk q4_0 && mk q4_k_m) &
    MP=$!
    (cd build && time ctest -L gpu -E "parallel|comm" -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1 &
    CP=$!
    cfg build-r0 -DTPI_GV_Q40RING=0
    bld build-r0 tpinfer
    wait $CP
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -8
    wait $MP
    BIN_DIR=${BIN_DIR:-.dev/q4r} unxz tpinfer-main || exit 1
    echo "at ${SECONDS}s: ab"
    ROUNDS=2 ABD=0 ab q4_0 main=/tmp/tpinfer-main r0=build-r0/tpinfer ring=build/tpinfer
    echo "at ${SECONDS}s"
    [ "$SECONDS" -lt 450 ] || { echo "no time left for Q4_K_M"; exit 0; }
    ROUNDS=2 ab q4_k_m main=/tmp/tpinfer-main ring=build/tpinfer
    echo "at ${SECONDS}s"
    ;;
H | N)
    main_at
    export MK_BIN=/tmp/tpinfer-main
    (mk q4_k_m && mk q8_0 && mk bf16 && mk q4_0) &
    MP=$!
    (cd /tmp/m/build && time ctest -L gpu -E "parallel|comm" -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1 &
    CP=$!
    [ "$PART" = H ] && [ "${TREE:-1}" = 1 ] && { cfg build && bld build tpinfer test_gemv_cuda; }
    wait $CP
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -8
    wait $MP
    echo "at ${SECONDS}s: table"
    for t in q4_k_m q8_0 bf16 q4_0; do
        /tmp/tpinfer-main bench -m /tmp/$t.gguf -p 512 -n 128 -r 3 -o md --roofline-gbps 4000 2>&1 |
            grep -E "^\||build"
    done
    for t in q4_k_m q8_0; do
        /tmp/tpinfer-main bench -m /tmp/$t.gguf -p 0 -n 128 -d 8192 -r 2 -o md \
            --roofline-gbps 4000 2>&1 | grep -E "^\| .*tg"
    done
    echo "at ${SECONDS}s"
    [ "$PART" = N ] || exit 0
    [ "$SECONDS" -lt 420 ] || { echo "no time left for the clusters' pair"; exit 0; }
    BIN_DIR=${BIN_DIR:-.dev/nt} unxz tpinfer || exit 1
    ROUNDS=2 ab q4_k_m main=/tmp/tpinfer-main skip=/tmp/tpinfer-main@TPI_DIAG_SKIP=norm \
        cl=/tmp/tpinfer@TPI_GEMV_NTAIL=2 tail=/tmp/tpinfer@TPI_GEMV_NTAIL=1
    echo "at ${SECONDS}s"
    ;;
P)
    main_at tpinfer
    MK_BIN=/tmp/tpinfer-main mk q4_k_m
    BIN_DIR=${BIN_DIR:-.dev/nt} unxz tpinfer || exit 1
    echo "at ${SECONDS}s: ab"
    ROUNDS=2 ab q4_k_m main=/tmp/tpinfer-main ncl=/tmp/tpinfer-main@TPI_ATTN_DEC_CLUSTER=0 \
        p0=/tmp/tpinfer-main@TPI_PDL=0@TPI_GEMV_PDL=0 \
        clp0=/tmp/tpinfer@TPI_GEMV_NTAIL=2@TPI_PDL=0@TPI_GEMV_PDL=0
    echo "at ${SECONDS}s"
    ;;
Y)
    cfg build
    bld build
    (cd build && time ctest -L gpu -E "parallel|comm" -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1 &
    CP=$!
    main_at tpinfer
    MK_BIN=/tmp/tpinfer-main mk q4_k_m
    wait $CP
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -8
    echo "at ${SECONDS}s: ab"
    ROUNDS=${ROUNDS:-2} ab q4_k_m main=/tmp/tpinfer-main tree=build/tpinfer
    echo "at ${SECONDS}s"
    ;;
K)
    cfg build
    bld build
    (cd build && time ctest -L gpu -E "parallel|comm" -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1 &
    CP=$!
    for t in ${KTYPES:-q3_k_m iq4_xs q2_k}; do mk $t; done
    wait $CP
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -8
    for t in ${KTYPES:-q3_k_m iq4_xs q2_k}; do
        echo "at ${SECONDS}s: bench $t"
        build/tpinfer bench -m /tmp/$t.gguf -p 512 -n 128 -r ${KR:-1} --roofline-gbps 4000 \
            2>>"$OUT/bench-k.err" | tee -a "$OUT/bench-k.md" | grep -E "pp512|tg128"
    done
    grep -E "run as" "$OUT/bench-k.err" | sort | uniq -c
    echo "at ${SECONDS}s"
    ;;
L)
    cfg build
    bld build
    if [ "${LCTEST:-1}" = 1 ]; then
        (cd build && time ctest -L gpu -R "gemv_cuda_(Q3_K|Q2_K|IQ4_NL|IQ4_XS|Q6_K|api)|ops_cuda|model_gpu|ops_fused" \
            -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1 &
    fi
    CP=$!
    main_at tpinfer
    for t in ${KTYPES:-q3_k_m q2_k iq4_xs}; do mk $t; done
    if [ "${LCTEST:-1}" = 1 ]; then
        wait $CP
        grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -8
    fi
    for t in ${KTYPES:-q3_k_m q2_k iq4_xs}; do
        echo "at ${SECONDS}s: ab $t"
        ROUNDS=${KR:-2} ABD=0 GREEDY_LENS=300 ab $t mown=/tmp/tpinfer-main@TPI_HOLD=0 \
            own=build/tpinfer held=build/tpinfer@TPI_HOLD=1
        for b in /tmp/tpinfer-main build/tpinfer; do
            [ "${LPP:-1}" = 1 ] || break
            for h in 1 0; do
                TPI_HOLD=$h $b bench -m /tmp/$t.gguf -p 512 -n 0 -r 2 2>>"$OUT/bench-l.err" |
                    tee -a "$OUT/bench-l.md" | grep pp512 | sed "s|^|$b TPI_HOLD=$h |"
            done
        done
    done
    echo "at ${SECONDS}s"
    ;;
G)
    cfg build
    bld build
    (cd build && time ctest -L gpu -R "gemv_cuda_(Q3_K|Q6_K|api)|ops_cuda|model_gpu|ops_fused" \
        -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1 &
    CP=$!
    main_at tpinfer
    mk q3_k_m
    wait $CP
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -12
    echo "at ${SECONDS}s: microbench"
    for r in 0 1; do
        TPI_Q3_REPACK=$r TPI_BENCH_TYPES=Q3_K TPI_BENCH_ROWS=1 \
            TPI_BENCH_SHAPES=4096x4096,4096x1024,4096x12288,12288x4096 build/tests/test_gemv_cuda bench \
            2>>"$OUT/gbench.err" | sed "s|^|repack=$r |"
    done
    echo "at ${SECONDS}s: ab"
    ROUNDS=${KR:-2} ABD=0 GREEDY_LENS=300 ab q3_k_m main=/tmp/tpinfer-main grp=build/tpinfer \
        r0=build/tpinfer@TPI_Q3_REPACK=0
    for b in /tmp/tpinfer-main build/tpinfer; do
        $b bench -m /tmp/q3_k_m.gguf -p 512 -n 0 -r 2 2>>"$OUT/bench-g.err" |
            tee -a "$OUT/bench-g.md" | grep pp512 | sed "s|^|$b |"
    done
    echo "at ${SECONDS}s"
    ;;
W)
    cfg build
    bld build tpinfer test_ops_fused test_gemv_cuda
    (cd build && time ctest -R "ops_fused_cuda|gemv_cuda_Q3_K" --timeout 300) >"$OUT/ctest.log" 2>&1 &
    CP=$!
    mk q3_k_m
    wait $CP
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -6
    echo "at ${SECONDS}s: ab"
    ROUNDS=${KR:-2} ABD=0 GREEDY_LENS=300 ab q3_k_m r0=build/tpinfer@TPI_Q3_REPACK=0 \
        grp=build/tpinfer g4=build/tpinfer@TPI_GLU=4 g0=build/tpinfer@TPI_GLU=0 \
        r0g0=build/tpinfer@TPI_Q3_REPACK=0@TPI_GLU=0
    echo "at ${SECONDS}s"
    ;;
V)
    cfg build
    bld build
    (cd build && time ctest -L gpu -R "ops_cuda_(matmul_(Q3_K|Q2_K|IQ4_NL|IQ4_XS)|embed)|model_gpu_(qwen2-tiny-q3_k_m|qwen2-tiny-iq4_xs|qwen3-tiny-q2_k)" \
        -j 4 --timeout 240) >"$OUT/ctest.log" 2>&1
    grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -12
    echo "at ${SECONDS}s"
    ;;
F)
    cfg build
    bld build
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        main_at tpinfer
        for t in iq4_xs q3_k_m; do mk $t; done
        for t in iq4_xs q3_k_m; do
            echo "at ${SECONDS}s: ab $t"
            ROUNDS=${KR:-1} ABD=0 GREEDY_LENS=300 ab $t mown=/tmp/tpinfer-main@TPI_HOLD=0 \
                own=build/tpinfer held=build/tpinfer@TPI_HOLD=1
        done
    else
        (cd build && time ctest -L gpu -E "parallel|comm" -j 3 --timeout 300) >"$OUT/ctest.log" 2>&1
        grep -E "tests passed|\*\*\*Failed|Total Test" "$OUT/ctest.log" | tail -12
    fi
    echo "at ${SECONDS}s"
    ;;
S)
    [ -x /tmp/tpinfer-main ] || main_at tpinfer
    MK_BIN=/tmp/tpinfer-main mk q4_k_m
    echo "at ${SECONDS}s: ab"
    ROUNDS=${ROUNDS:-1} ABD="8192 0" GREEDY_LENS="" ab q4_k_m main=/tmp/tpinfer-main \
        na=/tmp/tpinfer-main@TPI_DIAG_SKIP=attn nn=/tmp/tpinfer-main@TPI_DIAG_SKIP=norm \
        nb=/tmp/tpinfer-main@TPI_DIAG_SKIP=norm,attn
    echo "at ${SECONDS}s"
    ;;
Q)
    [ -x /tmp/tpinfer-main ] || main_at tpinfer
    cfg build
    bld build tpinfer test_gemv_cuda
    for g in host Q4_0; do
        echo "gemv $g: $(build/tests/test_gemv_cuda $g 2>&1 | tail -1)"
    done
    mk q4_0
    echo "at ${SECONDS}s: ab"
    ROUNDS=${QR:-4} ABD=0 ab q4_0 main=/tmp/tpinfer-main b0=build/tpinfer \
        b6=build/tpinfer@TPI_GEMV_Q40B=6 b12=build/tpinfer@TPI_GEMV_Q40B=12
    echo "at ${SECONDS}s"
    ;;
esac
