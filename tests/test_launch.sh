#!/usr/bin/env bash
# test_launch.sh — tests of the launch wrappers (launch/tpinfer-local, tpinfer-cluster).
#
#   test_launch.sh dryrun    SRC              --dry-run argv equals tests/launch/*.argv
#                                             exactly; error cases exit non-zero with
#                                             a clear message
#   test_launch.sh signal    SRC              SIGTERM/SIGINT to the wrapper's pid reach
#                                             every rank (the wrapper execs mpirun)
#   test_launch.sh netns     SRC TPINFER      two network namespaces as two "hosts",
#                                             Open MPI over TCP between them: hello, then
#                                             `tpinfer comm --check-only` via tpinfer-cluster
#   test_launch.sh netns-run SRC TPINFER [MODEL]
#                                             the same hosts: `tpinfer run --pp 2` across them
#                                             gives the tokens of a single-rank run
# Exit 0 pass, 1 fail, 77 skip (no mpirun; namespaces cannot be made; no model).
# Expected argv files: one word per line; "@ROOT@" stands for --allow-run-as-root
# (present only when the test runs as root), "@SRC@" for the source directory.
set -uo pipefail

mode=${1:?usage: test_launch.sh dryrun|signal|netns|netns-run SRC [TPINFER] [MODEL]}
SRC=$(cd "${2:?source directory}" && pwd)
TPI_BIN=${3:-}
MODEL=${4:-}
DATA=$SRC/tests/launch
tmp=$(mktemp -d /tmp/tpi-launch.XXXXXX)
n_fail=0
NS_A="" NS_B=""

# Whatever happens (pass, fail, skip, Ctrl-C), remove the namespaces and the temp dir.
cleanup() {
    [ -n "$NS_A" ] && bash "$SRC/launch/netns-hosts.sh" down "$NS_A" "$NS_B"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

fail() {
    echo "FAIL: $*"
    n_fail=$((n_fail + 1))
}

skip() {
    echo "SKIP: $*"
    exit 77
}

# --------------------------------------------------------------------------- dryrun

# dry NAME [VAR=VALUE...] -- WRAPPER ARGS...: run WRAPPER --dry-run in a clean
# environment (only PATH plus the given variables), from tests/launch/, and compare
# the words of the printed command with tests/launch/NAME.argv.
dry() {
    local name=$1 envs=() want got out rc
    shift
    while [ "$1" != -- ]; do
        envs+=("$1")
        shift
    done
    shift
    local wrapper=$1
    shift
    out=$(cd "$DATA" && env -i PATH="$PATH" "${envs[@]}" "$SRC/launch/$wrapper" "$@" 2>"$tmp/$name.err")
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "$name: $wrapper exited $rc: $(cat "$tmp/$name.err")"
        return
    fi
    if [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ]; then
        fail "$name: expected one line on stdout, got: $out"
        return
    fi
    # Parse the printed line as a shell would: this also checks the quoting.
    local words
    eval "words=($out)" || {
        fail "$name: printed command does not parse: $out"
        return
    }
    got=$tmp/$name.got
    want=$tmp/$name.want
    printf '%s\n' "${words[@]}" >"$got"
    local root_sub='/^@ROOT@$/d'
    [ "$(id -u)" -eq 0 ] && root_sub='s/^@ROOT@$/--allow-run-as-root/'
    sed -e "$root_sub" -e "s|@SRC@|$SRC|g" "$DATA/$name.argv" >"$want"
    if diff -u "$want" "$got" >"$tmp/$name.diff"; then
        echo "ok   $name: $out"
    else
        fail "$name: argv differs from tests/launch/$name.argv (- want, + got):"
        cat "$tmp/$name.diff"
    fi
}

# bad NAME PATTERN [VAR=VALUE...] -- WRAPPER ARGS...: must exit non-zero, print
# nothing on stdout, and say PATTERN (grep -E) on stderr.
bad() {
    local name=$1 pat=$2 envs=() out rc
    shift 2
    while [ "$1" != -- ]; do
        envs+=("$1")
        shift
    done
    shift
    local wrapper=$1
    shift
    out=$(cd "$DATA" && env -i PATH="$PATH" "${envs[@]}" "$SRC/launch/$wrapper" "$@" 2>"$tmp/$name.err")
    rc=$?
    if [ $rc -eq 0 ]; then
        fail "$name: exit 0, expected an error; stdout: $out"
    elif [ -n "$out" ]; then
        fail "$name: printed a command on stdout despite the error: $out"
    elif ! grep -Eq -- "$pat" "$tmp/$name.err"; then
        fail "$name: stderr lacks /$pat/: $(cat "$tmp/$name.err")"
    else
        echo "ok   $name (exit $rc): $(head -1 "$tmp/$name.err")"
    fi
}

test_dryrun() {
    local T=TPINFER=/opt/tpinfer/bin/tpinfer
    dry local-tp2 $T -- tpinfer-local --dry-run --tp 2 -- run -m x.gguf -p hi
    dry local-env-quote $T NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_NVLS_ENABLE=1 \
        CUDA_VISIBLE_DEVICES=0,1,2,3 OMP_NUM_THREADS=8 TPI_LOG=debug LD_LIBRARY_PATH=/x \
        UNRELATED=1 -- tpinfer-local --tp 2 --pp 2 --mpirun /usr/local/bin/mpirun --bind-to numa \
        --mca btl ^openib --dry-run -- bench -m "/models/my model's.gguf" -p 512
    dry local-default-bin-comm -- tpinfer-local --dry-run --tp 4 --oversubscribe -- comm --check-only
    dry cluster-hostfile $T NCCL_DEBUG=WARN NCCL_IB_HCA=mlx5 LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
        -- tpinfer-cluster --dry-run --hostfile hosts-2x4.txt --gpus-per-node 4 --tp 4 --pp 2 \
        --iface ib0 --debug-comm -- run -m /models/q.gguf -f prompts.jsonl -o out.jsonl
    dry cluster-hosts $T -- tpinfer-cluster --dry-run --hosts gpu-a,gpu-b,gpu-c,gpu-d \
        --gpus-per-node 8 --tp 8 --pp 4 -- run -m /models/q.gguf -p "hello world"
    dry cluster-span-comm $T -- tpinfer-cluster --dry-run --hosts a,b --gpus-per-node 2 --tp 4 \
        --pp 1 --allow-tp-across-nodes -- comm --check-only
    grep -q "would span nodes" "$tmp/cluster-span-comm.err" ||
        fail "cluster-span-comm: no warning about the TP group spanning nodes"
    dry cluster-idle-host $T -- tpinfer-cluster --dry-run --hosts a:8,b:8 --gpus-per-node 4 \
        --tp 2 --pp 2 -- run -m m.gguf -p hi
    grep -q "fill only 1 of 2 host" "$tmp/cluster-idle-host.err" ||
        fail "cluster-idle-host: no warning about the idle host"

    local C=(-- tpinfer-cluster --dry-run)
    bad span-tp3 "TP group of 3 ranks would span nodes" "${C[@]}" --hosts a,b --gpus-per-node 4 \
        --tp 3 --pp 2 -- run -m m.gguf
    bad span-tp8 "TP group of 8 ranks would span nodes.*--allow-tp-across-nodes" "${C[@]}" \
        --hosts a,b --gpus-per-node 4 --tp 8 --pp 1 -- run -m m.gguf
    bad no-fit "tp\*pp = 4\*3 = 12 ranks do not fit on 2 host\(s\) x 4 GPUs = 8" "${C[@]}" \
        --hosts a,b --gpus-per-node 4 --tp 4 --pp 3 -- run -m m.gguf
    bad no-fit-hostfile "16 ranks do not fit on 2 host" "${C[@]}" --hostfile hosts-2x4.txt \
        --gpus-per-node 4 --tp 4 --pp 4 -- run -m m.gguf
    bad small-slots "hosts-small-slots.txt:3: host 'node2' has 2 slot\(s\), fewer than --gpus-per-node 4" \
        "${C[@]}" --hostfile hosts-small-slots.txt --gpus-per-node 4 --tp 4 --pp 2 -- run
    bad small-slots-hosts "host 'b' has 2 slot\(s\)" "${C[@]}" --hosts a:4,b:2 --gpus-per-node 4 \
        --tp 4 --pp 2 -- run
    bad dup-host "hosts-dup.txt:2: host 'node1' is listed twice" "${C[@]}" --hostfile hosts-dup.txt \
        --gpus-per-node 4 --tp 4 --pp 1 -- run
    bad bad-field "hosts-bad-field.txt:2: unknown field 'slot=4'" "${C[@]}" \
        --hostfile hosts-bad-field.txt --gpus-per-node 4 --tp 4 --pp 1 -- run
    bad max-slots "hosts-max-slots.txt:1: slots=4 is more than max_slots=2" "${C[@]}" \
        --hostfile hosts-max-slots.txt --gpus-per-node 2 --tp 2 --pp 1 -- run
    out=$(cd "$DATA" && TPINFER=/bin/true "$SRC/launch/tpinfer-cluster" --dry-run --hostfile \
        hosts-spellings.txt --gpus-per-node 4 --tp 4 --pp 3 -- run 2>"$tmp/spell.err") ||
        fail "hosts-spellings.txt (spaces around =, cpu=, count=, user@host) refused: $(cat "$tmp/spell.err")"
    printf 'node1 slots=4\r\n' >"$tmp/crlf.txt"
    bad crlf "crlf.txt:1: Windows line ends \(CRLF\), which mpirun cannot parse" "${C[@]}" \
        --hostfile "$tmp/crlf.txt" --gpus-per-node 4 --tp 4 --pp 1 -- run
    bad empty-hostfile "hosts-empty.txt: no hosts" "${C[@]}" --hostfile hosts-empty.txt \
        --gpus-per-node 4 --tp 4 --pp 1 -- run
    bad missing-hostfile "cannot read hostfile 'nope.txt'" "${C[@]}" --hostfile nope.txt \
        --gpus-per-node 4 --tp 4 --pp 1 -- run
    bad no-hosts "no hosts: give --hostfile F or --hosts" "${C[@]}" --gpus-per-node 4 --tp 4 \
        --pp 1 -- run
    bad no-gpn "--gpus-per-node G is required" "${C[@]}" --hosts a --tp 1 --pp 1 -- run
    bad tp-after-dashdash "give --tp to tpinfer-cluster" "${C[@]}" --hosts a,b --gpus-per-node 4 \
        --tp 4 --pp 2 -- run --tp 2
    bad bad-iface "--iface expects an interface name" "${C[@]}" --hosts a --gpus-per-node 1 \
        --tp 1 --pp 1 --iface "eth0 x" -- run

    local L=(-- tpinfer-local)
    bad local-tp0 "--tp expects an integer >= 1, got '0'" "${L[@]}" --dry-run --tp 0 -- run
    bad local-no-cmd "no tpinfer command after --" "${L[@]}" --dry-run --tp 2 --
    bad local-unknown "unknown option '--np'" "${L[@]}" --dry-run --np 2 -- run
    bad local-tp-after "give --pp to tpinfer-local" "${L[@]}" --dry-run --tp 2 -- run --pp 2
    bad local-npgpu-dry "--np-per-gpu with --dry-run needs --tp" "${L[@]}" --dry-run --np-per-gpu \
        -- run
    # without --dry-run the binary must exist (checked before mpirun is looked for)
    bad local-no-binary "tpinfer not found at /nonexistent/tpinfer" TPINFER=/nonexistent/tpinfer \
        -- tpinfer-local --tp 1 -- run -m m.gguf
}

# --------------------------------------------------------------------------- signal

test_signal() {
    command -v mpirun >/dev/null || skip "no mpirun on PATH (install openmpi-bin)"
    # A fake tpinfer: each rank records its arguments, then the signal it gets.
    cat >"$tmp/fake-tpinfer" <<EOF
#!/usr/bin/env bash
r=\${OMPI_COMM_WORLD_RANK:-x}
# Log and stay: Open MPI SIGKILLs the ranks 1 s after the SIGTERM anyway, and a rank
# that exited at once would make mpirun SIGKILL the others before they could log.
trap 'echo "rank \$r got TERM" >>"$tmp/sig.log"' TERM
trap 'echo "rank \$r got INT" >>"$tmp/sig.log"' INT
echo "rank \$r ready \$*" >>"$tmp/sig.log"
# wait (unlike a foreground sleep) returns at once when a signal arrives
while :; do sleep 0.1 & wait \$!; done
EOF
    chmod +x "$tmp/fake-tpinfer"
    local sig pid
    for sig in TERM INT; do
        rm -f "$tmp/sig.log"
        TPINFER=$tmp/fake-tpinfer "$SRC/launch/tpinfer-local" --oversubscribe --tp 2 -- run -m m.gguf \
            2>"$tmp/wrapper.err" &
        pid=$!
        for _ in $(seq 300); do
            [ "$(grep -c ready "$tmp/sig.log" 2>/dev/null)" = 2 ] && break
            sleep 0.1
        done
        if [ "$(grep -c ready "$tmp/sig.log" 2>/dev/null)" != 2 ]; then
            fail "signal $sig: the two ranks did not start: $(cat "$tmp/wrapper.err")"
            kill -9 "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            continue
        fi
        # the wrapper's pid must now be mpirun itself (exec), so the signal reaches it
        local comm
        comm=$(ps -o comm= -p "$pid")
        [ "$comm" = mpirun ] || [ "$comm" = orterun ] ||
            fail "signal $sig: pid $pid is '$comm', not mpirun: the wrapper did not exec"
        kill -"$sig" "$pid"
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            fail "signal $sig: mpirun still running 10 s after SIG$sig"
            kill -9 "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null
        sleep 0.3
        # Open MPI 4.1 answers SIGINT/SIGTERM at mpirun with SIGCONT to every rank,
        # SIGTERM odls_base_sigkill_timeout (1 s) later, SIGKILL 1 s after that.
        local n_got
        n_got=$(grep -c "got " "$tmp/sig.log")
        if [ "$n_got" = 2 ]; then
            echo "ok   SIG$sig to the wrapper: $(grep 'got ' "$tmp/sig.log" | sort | paste -sd';')"
        else
            fail "signal $sig: $n_got of 2 ranks saw a signal: $(cat "$tmp/sig.log")"
        fi
    done
}

# --------------------------------------------------------------------------- netns

netns_up() {
    command -v mpirun >/dev/null || skip "no mpirun on PATH (install openmpi-bin)"
    [ -n "$TPI_BIN" ] && [ -x "$TPI_BIN" ] || skip "tpinfer binary not given or not built: '$TPI_BIN'"
    bash "$SRC/launch/netns-hosts.sh" check
    local rc=$?
    [ $rc -eq 77 ] && skip "network namespaces cannot be made here (see the reason above)"
    [ $rc -eq 0 ] || skip "netns-hosts.sh check failed ($rc)"
    # set before `up`, so that a half-made pair is removed too
    NS_A=tpi$$a
    NS_B=tpi$$b
    bash "$SRC/launch/netns-hosts.sh" up "$NS_A" "$NS_B" || {
        echo "FAIL: could not set up namespaces $NS_A $NS_B"
        exit 1
    }
    # Open MPI reaches a "host" through this instead of ssh.
    printf '#!/bin/sh\nexec bash %q agent "$@"\n' "$SRC/launch/netns-hosts.sh" >"$tmp/agent"
    chmod +x "$tmp/agent"
    echo "namespaces $NS_A (10.99.0.1) and $NS_B (10.99.0.2) joined by veth-tpi"
}

# Run tpinfer-cluster from inside namespace A: mpirun lives on "host" A, both ranks'
# daemons are started through the agent, all traffic crosses veth-tpi over TCP.
cluster_in_ns() {
    # OMP passive: with ranks > cores, spinning OpenMP threads starve the MPI peer
    OMP_WAIT_POLICY=passive TPINFER=$TPI_BIN timeout 120 ip netns exec "$NS_A" \
        "$SRC/launch/tpinfer-cluster" --hosts "$NS_A,$NS_B" --gpus-per-node 1 --iface veth-tpi \
        --mca plm_rsh_agent "$tmp/agent" --mca btl tcp,self "$@"
}

test_netns() {
    netns_up
    # 1. hello: each rank reports the address of its own namespace
    local out
    out=$(timeout 60 ip netns exec "$NS_A" mpirun --allow-run-as-root -np 2 --host "$NS_A:1,$NS_B:1" \
        --map-by ppr:1:node --mca plm_rsh_agent "$tmp/agent" --mca btl tcp,self \
        --mca btl_tcp_if_include veth-tpi --mca oob_tcp_if_include veth-tpi \
        sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(ip -4 -o addr show dev veth-tpi | awk "{print \$4}")"' \
        2>"$tmp/hello.err" | sort)
    local want=$'rank 0 10.99.0.1/24\nrank 1 10.99.0.2/24'
    if [ "$out" = "$want" ]; then
        echo "ok   mpirun hello across namespaces: $(echo "$out" | paste -sd';')"
    else
        fail "mpirun hello: got '$out', want '$want'; stderr: $(cat "$tmp/hello.err")"
    fi
    # 2. the communicator sanity check through the cluster wrapper
    out=$(cluster_in_ns --tp 1 --pp 2 -- comm --check-only --comm mpi 2>"$tmp/comm.err")
    local rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c 'PASS' <<<"$out")" = 2 ]; then
        echo "ok   tpinfer comm --check-only across namespaces: $(echo "$out" | paste -sd';')"
    else
        fail "tpinfer comm across namespaces: exit $rc, stdout '$out'; stderr: $(cat "$tmp/comm.err")"
    fi
}

test_netns_run() {
    if [ -z "$MODEL" ]; then
        for m in "$SRC/../shared/data/qwen3-tiny-q4_k_m.gguf" "$SRC/tests/data/qwen3-tiny-q4_k_m.gguf"; do
            [ -f "$m" ] && MODEL=$(cd "$(dirname "$m")" && pwd)/$(basename "$m") && break
        done
    fi
    [ -n "$MODEL" ] && [ -f "$MODEL" ] || skip "no tiny model (qwen3-tiny-q4_k_m.gguf in ../shared/data or tests/data)"
    netns_up
    local args=(-m "$MODEL" --prompt-ids "1,2,3,4,5,6,7" -n 8 --temp 0 --seed 1 --json --backend cpu)
    # reference: one rank, no mpirun
    local ref rc
    ref=$(OMP_WAIT_POLICY=passive timeout 120 "$TPI_BIN" run "${args[@]}" 2>"$tmp/ref.err")
    rc=$?
    grep -q "not available in this build" "$tmp/ref.err" && skip "tpinfer run is not built yet"
    if [ $rc -ne 0 ]; then
        fail "single-rank run: exit $rc: $(tail -3 "$tmp/ref.err")"
        return
    fi
    local got
    got=$(cluster_in_ns --tp 1 --pp 2 -- run "${args[@]}" --comm mpi 2>"$tmp/pp2.err")
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "pp=2 across namespaces: exit $rc: $(tail -5 "$tmp/pp2.err")"
        return
    fi
    local t_ref t_got
    t_ref=$(tr -d ' \n' <<<"$ref" | grep -o '"tokens":\[[0-9,]*\]')
    t_got=$(tr -d ' \n' <<<"$got" | grep -o '"tokens":\[[0-9,]*\]')
    if [ -n "$t_ref" ] && [ "$t_ref" = "$t_got" ] && [ "$(grep -o , <<<"$t_ref" | wc -l)" = 7 ]; then
        echo "ok   pp=2 across namespaces = single rank: $t_got"
    else
        fail "tokens differ: single rank $t_ref, pp=2 across namespaces $t_got"
        echo "single rank: $ref"
        echo "pp=2:        $got"
    fi
}

case $mode in
dryrun) test_dryrun ;;
signal) test_signal ;;
netns) test_netns ;;
netns-run) test_netns_run ;;
*)
    echo "unknown mode '$mode'"
    exit 2
    ;;
esac
if ((n_fail)); then
    echo "$n_fail check(s) failed"
    exit 1
fi
echo "all checks passed"
exit 0
