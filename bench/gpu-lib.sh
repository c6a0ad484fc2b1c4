# shellcheck shell=bash
# bench/gpu-lib.sh — helpers shared by the device-run scripts (gpu-session.sh,
# gpu-multi.sh, the exp-*.sh experiments); sourced, not run. For the timed steps the
# caller sets T0=$SECONDS, BUDGET_S, SUM (summary file) and STEPS first.

elapsed() { echo $((SECONDS - T0)); }
left() { echo $((BUDGET_S - (SECONDS - T0))); }
note() { echo "[gpu +$(elapsed)s] $*" | tee -a "$SUM"; }
has_step() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

# bounded NAME LIMIT_S LOG CMD...: CMD under timeout (capped by the time left minus 10 s),
# output appended to LOG; prints and returns its status.
bounded() {
    local name=$1 limit=$2 log=$3
    shift 3
    local l
    l=$(($(left) - 10))
    [ "$limit" -gt "$l" ] && limit=$l
    if [ "$limit" -lt 5 ]; then
        note "$name: SKIPPED (no time left)"
        return 124
    fi
    echo "=== $name (limit ${limit}s): $*" >>"$log"
    local t=$SECONDS
    timeout -k 5 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    note "$name: rc=$rc in $((SECONDS - t)) s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
    return $rc
}

# Point ../shared/data at the tiny models carried in .dev/data when the real one is absent.
link_test_data() {
    if [ ! -e ../shared/data ] && ls .dev/data/*.gguf >/dev/null 2>&1; then
        mkdir -p ../shared 2>/dev/null && ln -s "$PWD/.dev/data" ../shared/data &&
            note "test data: ../shared/data -> .dev/data ($(ls .dev/data/*.gguf | wc -l) models)"
    fi
}

# ctest_summary LOG PATTERN: the pass count and each test's line from a ctest -V log,
# then the log's lines matching PATTERN (first occurrence of each, at most 80).
ctest_summary() {
    grep -E 'tests passed|tests failed' "$1" 2>/dev/null | sed 's/^/   /'
    grep -E "Test +#[0-9]+: " "$1" 2>/dev/null |
        sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //; s/ \.+/ /' | awk '{printf "   %s\n", $0}'
    grep -hE "$2" "$1" 2>/dev/null | sed -E 's/^[0-9]+: //' | awk '!seen[$0]++' | head -80 |
        sed 's/^/   /'
}

# The device tool brings back a handful of files (8 were seen): the logs go into one
# archive, so the summaries always come back.
pack_logs() {
    (
        cd "$OUT" || exit 0
        logs=$(ls -- *.log *.csv 2>/dev/null | grep -v '^console\.log$')
        # shellcheck disable=SC2086
        [ -n "$logs" ] && tar czf logs.tgz $logs && rm -f $logs
    )
}

# device_prep: on the device machine, Check's packages (.dev/device/setup.sh, its log in
# $OUT), /work/main naming this tree (the tests find ../shared through it), and Check's
# settings for running a test binary by hand.
device_prep() {
    sh .dev/device/setup.sh >"$OUT/setup.log" 2>&1 || { echo setup failed; tail "$OUT/setup.log"; }
    [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
    export CK_FORK=no CK_DEFAULT_TIMEOUT=900
}

# unxz NAME: ${BIN_DIR:-.dev}/NAME.xz (a binary built elsewhere) unpacked to /tmp/NAME.
unxz() { xz -dc "${BIN_DIR:-.dev}/$1.xz" >"/tmp/$1" && chmod +x "/tmp/$1"; }
