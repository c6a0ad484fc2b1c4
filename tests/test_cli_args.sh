#!/usr/bin/env bash
# tests/test_cli_args.sh SRC TPINFER — the sampling options and --seed, which `run -p` and
# the batch `run -f` share: a value out of range is refused before any model is loaded
# (exit 2, one line naming the option and the value), both forms take the same values,
# `--seed -1` draws a random seed that the run reports and that repeats the run, and
# `--system` or `--chat-template-kwargs` without `--chat` is refused; and run -p's
# --logit-bias and --ignore-eos, escapes, -n -1 and --logprobs past the vocabulary; and
# `run --help` lists the batch options too. Exit 0 pass, 1 fail.
set -u
src=$1
tp=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
n_fail=0
fail() {
    echo "test_cli_args: $*" >&2
    n_fail=$((n_fail + 1))
}
m=$src/tests/data/qwen3-tiny-q4_k_m.gguf
[ -f "$m" ] || { echo "test_cli_args: $m is missing" >&2; exit 1; }
printf '{"id": "a", "prompt": "Hello", "max_tokens": 4}\n' >"$tmp/p.jsonl"
run_p=(run -m "$m" --backend cpu -p Hello -n 4)
run_f=(run -m "$m" --backend cpu -f "$tmp/p.jsonl")

# A single prompt's option given with -f names the request field that does its work.
"$tp" "${run_f[@]}" --stop x >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && [ "$(cat "$tmp/err")" = 'tpinfer run: --stop applies to -p; with -f a request line sets "stop"' ] ||
    fail "run -f --stop: exit $rc: $(cat "$tmp/err")"

# `run --help` shows both forms: the batch options with the single prompt's.
help=$("$tp" run --help 2>&1)
for opt in --prompt-ids --parallel --resume --no-prefix-share --top-p --tp; do
    [[ "$help" == *"$opt"* ]] || fail "run --help lacks $opt"
done

refused() { # refused OPTION VALUE: both forms exit 2 with one line naming both
    local form
    for form in p f; do
        local -n args=run_$form
        "$tp" "${args[@]}" "$1" "$2" >"$tmp/out" 2>"$tmp/err"
        local rc=$?
        [ "$rc" = 2 ] || fail "run -$form $1 '$2': exit $rc, want 2"
        [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q -- "^tpinfer run: $1 .*'$2'" "$tmp/err" ||
            fail "run -$form $1 '$2': want one line naming it, got: $(cat "$tmp/err")"
        [ -s "$tmp/out" ] && fail "run -$form $1 '$2': wrote results"
    done
}
taken() { # taken OPTION VALUE: both forms run
    local form
    for form in p f; do
        local -n args=run_$form
        "$tp" "${args[@]}" "$1" "$2" >"$tmp/out" 2>"$tmp/err" ||
            fail "run -$form $1 '$2': exit $?: $(tail -1 "$tmp/err")"
    done
}

refused --temp nan
refused --temp inf
refused --temp 0.5x
refused --top-k -2
refused --top-k 1.5
refused --top-k 2000000000
refused --top-p 1.5
refused --top-p -0.1
refused --min-p 2
refused --repeat-penalty 0
refused --repeat-penalty -1
refused --repeat-last-n -2
refused --presence-penalty 2.5
refused --frequency-penalty -3
refused --seed -2
refused --seed 1e3
refused --seed 18446744073709551616
taken --temp -1
taken --top-k -1
taken --top-k 0
taken --top-p 1
taken --min-p 0
taken --repeat-penalty 1.1
taken --repeat-last-n 0
taken --repeat-last-n -1
taken --presence-penalty -2
taken --seed 18446744073709551615

# --system without --chat would be dropped silently: refused instead.
"$tp" "${run_p[@]}" --system "Be brief." >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--system applies to --chat only" "$tmp/err" ||
    fail "run -p --system without --chat: exit $rc: $(cat "$tmp/err")"
"$tp" "${run_p[@]}" --chat --system "Be brief." >"$tmp/out" 2>"$tmp/err" ||
    fail "run -p --chat --system: exit $?: $(tail -1 "$tmp/err")"
# So would --chat-template-kwargs; a value that is not an object, or an enable_thinking
# that is not a boolean, is refused.
"$tp" "${run_p[@]}" --chat-template-kwargs '{"enable_thinking": false}' >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && grep -q -- "--chat-template-kwargs applies to --chat only" "$tmp/err" ||
    fail "run -p --chat-template-kwargs without --chat: exit $rc: $(cat "$tmp/err")"
for v in '[1]' '{"enable_thinking": 0}' '{'; do
    "$tp" "${run_p[@]}" --chat --chat-template-kwargs "$v" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" = 2 ] && grep -q -- "--chat-template-kwargs: " "$tmp/err" && grep -qF -- "'$v'" "$tmp/err" ||
        fail "run -p --chat-template-kwargs '$v': exit $rc: $(cat "$tmp/err")"
done
"$tp" "${run_p[@]}" --chat --chat-template-kwargs '{"enable_thinking": false}' >"$tmp/out" \
    2>"$tmp/err" || fail "run -p --chat --chat-template-kwargs: exit $?: $(tail -1 "$tmp/err")"

# run -p's --logit-bias (llama.cpp's ID+BIAS / ID-BIAS) and --ignore-eos: +100 makes a token
# every token; +100 on the end of generation (2047 in the tiny vocabulary) ends at once,
# unless --ignore-eos keeps it out of the draws; -inf keeps the greedy first token out.
# A token given twice gets the sum.
json_of() { "$tp" "${run_p[@]}" --temp 0 --json "$@" 2>/dev/null; }
[[ "$(json_of --logit-bias 77+100)" == *'"tokens":[77,77,77,77],'* ]] ||
    fail "--logit-bias 77+100: $(json_of --logit-bias 77+100)"
[[ "$(json_of --logit-bias 2047+100)" == *'"tokens":[],'*'"finish_reason":"stop"'* ]] ||
    fail "--logit-bias 2047+100: $(json_of --logit-bias 2047+100)"
# the same token again adds up, as llama.cpp's entries do: +60 twice is +120, over 77's +100
[[ "$(json_of --logit-bias 77+100 --logit-bias 78+60 --logit-bias 78+60)" == \
    *'"tokens":[78,78,78,78],'* ]] ||
    fail "--logit-bias 78+60 twice: $(json_of --logit-bias 77+100 --logit-bias 78+60 --logit-bias 78+60)"
out=$(json_of --logit-bias 2047+100 --ignore-eos)
[[ "$out" == *'"finish_reason":"length"'* && "$out" != *2047* ]] ||
    fail "--logit-bias 2047+100 --ignore-eos: $out"
first=$(json_of | sed -n 's/.*"tokens":\[\([0-9]*\).*/\1/p')
[ -n "$first" ] && [[ "$(json_of --logit-bias "$first-inf")" != *"\"tokens\":[$first,"* ]] ||
    fail "--logit-bias $first-inf: $(json_of --logit-bias "$first-inf")"
for v in 5+x '5*2' 5+inf -5+1 5+; do
    "$tp" "${run_p[@]}" --logit-bias "$v" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" = 2 ] && grep -qF -- "--logit-bias expects ID+BIAS or ID-BIAS" "$tmp/err" ||
        fail "--logit-bias '$v': exit $rc: $(cat "$tmp/err")"
done
"$tp" "${run_p[@]}" --logit-bias 5000+1 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] && grep -q "token 5000 is outside the vocabulary of 2048" "$tmp/err" ||
    fail "--logit-bias 5000+1: exit $rc: $(cat "$tmp/err")"

# llama.cpp's forms: -p's escapes processed (\n is a newline; --no-escape keeps the
# backslash); -n -1 generates as many as the context holds;
# --logprobs past the vocabulary lists the whole vocabulary, no more.
ids_of() { "$tp" run -m "$m" --backend cpu -n 0 --json "$@" 2>/dev/null |
    sed -n 's/.*"prompt_tokens":\[\([0-9,]*\)\].*/\1/p'; }
nl=$(ids_of -p 'a
b')
[ -n "$nl" ] && [ "$(ids_of -p 'a\nb')" = "$nl" ] ||
    fail "-p 'a\\nb' is not 'a', a newline, 'b': $(ids_of -p 'a\nb') vs $nl"
[ "$(ids_of -p 'a\nb' --no-escape)" != "$nl" ] || fail "--no-escape: the escape was processed"
[ "$(ids_of -p 'tab\there' )" = "$(ids_of -p "tab$(printf '\t')here")" ] || fail "-p '\\t'"
[ "$(ids_of -p 'x\x41y' )" = "$(ids_of -p 'xAy')" ] || fail "-p '\\x41'"
out=$("$tp" run -m "$m" --backend cpu -p Hello -n -1 -c 24 --temp 0 --ignore-eos --json 2>"$tmp/err")
n_gen=$(printf '%s' "$out" | sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p' | awk -F, '{print NF}')
n_pr=$(printf '%s' "$out" | sed -n 's/.*"prompt_tokens":\[\([0-9,]*\)\].*/\1/p' | awk -F, '{print NF}')
[ $((n_gen + n_pr)) = 24 ] || fail "-n -1 -c 24: $n_pr + $n_gen tokens: $out $(cat "$tmp/err")"
out=$("$tp" run -m "$m" --backend cpu -p Hello -n 2 --temp 0 --json --logprobs 5000 2>"$tmp/err")
n_alt=$(printf '%s' "$out" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["logprobs"][0]))' 2>&1)
[ "$n_alt" = 2048 ] || fail "--logprobs 5000 on a vocabulary of 2048: $n_alt alternatives"
# token_logprobs: each sampled token's own logprob, also where it is outside the top K;
# the reference is the whole distribution the prompt's scoring gives at that position.
"$tp" run -m "$m" --backend cpu -p Hello -n 4 --temp 5 --seed 3 --json --logprobs 1 >"$tmp/g.json" 2>"$tmp/err" ||
    fail "--logprobs 1 --temp 5: exit $?: $(cat "$tmp/err")"
ids=$(python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); print(",".join(map(str, o["prompt_tokens"] + o["tokens"][:-1])))' "$tmp/g.json")
"$tp" run -m "$m" --backend cpu --prompt-ids "$ids" -n 1 --temp 0 --json --prompt-logprobs 5000 >"$tmp/s.json" 2>"$tmp/err" ||
    fail "--prompt-logprobs 5000: exit $?: $(cat "$tmp/err")"
python3 - "$tmp/g.json" "$tmp/s.json" <<'PY' || fail "token_logprobs differ from the scored distributions"
import json, sys
g, s = (json.load(open(f)) for f in sys.argv[1:3])
n_p = len(g["prompt_tokens"])
outside = 0
for j, (tok, lp) in enumerate(zip(g["tokens"], g["token_logprobs"])):
    ref = dict(map(tuple, s["prompt_logprobs"][n_p - 1 + j]))[tok]
    assert abs(lp - ref) < 2e-3, (j, tok, lp, ref)
    outside += g["logprobs"][j][0][0] != tok
assert len(g["token_logprobs"]) == len(g["tokens"]) == 4 and outside > 0, g
PY

# --seed -1: a random seed, reported, and the reported seed repeats the run's results
# (the records' timings differ; their texts and tokens must not).
results() { sed 's/"ttft_ms".*//' "$1"; }
repeats() { # repeats FORM PATTERN: PATTERN's \1 is the seed the --seed -1 run reported
    local -n args=run_$1
    "$tp" "${args[@]}" --seed -1 --temp 1 >"$tmp/r1" 2>"$tmp/e1" || fail "run -$1 --seed -1: exit $?"
    local seed
    seed=$(sed -n "s/$2/\1/p" "$tmp/e1")
    [ -n "$seed" ] || { fail "run -$1 --seed -1: no seed reported: $(cat "$tmp/e1")"; return; }
    "$tp" "${args[@]}" --seed "$seed" --temp 1 >"$tmp/r2" 2>/dev/null
    [ -s "$tmp/r1" ] && [ "$(results "$tmp/r1")" = "$(results "$tmp/r2")" ] ||
        fail "run -$1 --seed $seed does not repeat the --seed -1 run: $(cat "$tmp/r1" "$tmp/r2")"
}
repeats p '.*, seed \([0-9]*\)$'
repeats f '.*--seed -1 drew the run seed \([0-9]*\) .*'
# Without --seed a batch run is repeatable (seed 0), unlike run -p.
"$tp" "${run_f[@]}" --temp 1 >"$tmp/b1" 2>/dev/null
"$tp" "${run_f[@]}" --temp 1 --seed 0 >"$tmp/b2" 2>/dev/null
[ "$(results "$tmp/b1")" = "$(results "$tmp/b2")" ] ||
    fail "run -f without --seed differs from --seed 0"

# The model's recommended sampling (general.sampling.*, written by mkmodel --sampling) is
# the default where no option is given, in both forms and for OpenAI lines too; a model
# that recommends greedy decoding gives the --temp 0 tokens.
"$tp" mkmodel -q -o "$tmp/rec.gguf" --sampling temp=0,top_k=20 2>"$tmp/err" ||
    fail "mkmodel --sampling: exit $?: $(cat "$tmp/err")"
"$tp" mkmodel -q -o "$tmp/bad.gguf" --sampling top_k=2.5 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && grep -q "'top_k=2.5' is not KEY=VALUE" "$tmp/err" || fail "mkmodel --sampling top_k=2.5: exit $rc: $(cat "$tmp/err")"
toks() { "$tp" run -m "$tmp/rec.gguf" --backend cpu -p Hello -n 8 --json --seed 5 "$@" 2>"$tmp/err" | sed -n 's/.*"tokens":\(\[[0-9,]*\]\).*/\1/p'; }
greedy=$(toks --temp 0)
[ -n "$greedy" ] && [ "$(toks)" = "$greedy" ] || fail "run -p on a model recommending temp 0: $(toks) vs $greedy"
grep -q "sampling as the model recommends (general.sampling.\*): --temp 0 --top-k 20;" "$tmp/err" ||
    fail "run -p: the model's sampling not reported: $(cat "$tmp/err")"
[ "$(toks --temp 1)" != "$greedy" ] || fail "run -p --temp 1 did not override the model's temp 0"
{
    printf '{"id": "ours", "prompt": "Hello", "max_tokens": 8, "seed": 5}\n'
    printf '{"custom_id": "oai", "url": "/v1/completions", "body": {"prompt": "Hello", "max_tokens": 8, "seed": 5}}\n'
} >"$tmp/rec.jsonl"
"$tp" run -m "$tmp/rec.gguf" --backend cpu -f "$tmp/rec.jsonl" -o "$tmp/rec.out" 2>"$tmp/err" ||
    fail "run -f on the recommending model: exit $?: $(cat "$tmp/err")"
python3 - "$tmp/rec.out" "$greedy" <<'PY' || fail "run -f: lines without sampling fields are not the model's greedy"
import json, sys
want = json.loads(sys.argv[2])
recs = {}
for line in open(sys.argv[1]):
    o = json.loads(line)
    recs[o.get("custom_id") or o["id"]] = o
assert recs["ours"]["tokens"] == want, recs["ours"]
oai = recs["oai"]["response"]["body"]["choices"][0]
assert oai["text"] == recs["ours"]["text"], (oai, recs["ours"])
PY
# A line's "seed": -1 is no seed (vLLM's and llama-server's reading): the run's, as when
# absent (it was the fixed seed 2^64 - 1).
body='"prompt": "Hello", "max_tokens": 8'
for form in ours oai; do
    line() { # line EXTRA: the form's line with EXTRA fields
        if [ "$form" = ours ]; then printf '{"id": "x", %s%s}\n' "$body" "$1"
        else printf '{"custom_id": "x", "url": "/v1/completions", "body": {%s%s}}\n' "$body" "$1"; fi
    }
    texts() { # texts EXTRA...: each line's text, one run
        local e
        for e in "$@"; do line "$e"; done >"$tmp/s.jsonl"
        "$tp" run -m "$m" --backend cpu -f "$tmp/s.jsonl" --ordered --seed 3 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    o = json.loads(l)
    print(json.dumps(o["text"] if "text" in o else o["response"]["body"]["choices"][0]["text"]))'
    }
    a=$(texts ', "temperature": 1, "seed": -1' ', "temperature": 1')
    [ -n "$a" ] && [ "$(printf '%s\n' "$a" | sed -n 1p)" = "$(texts ', "temperature": 1')" ] ||
        fail "$form: a line with seed -1 is not the line without a seed: $a"
done

# --resume over a file with a damaged line among its records: refused before any work,
# naming the line, the file as it was (the run appended after it, leaving a file no JSONL
# reader takes and the request twice).
"$tp" "${run_f[@]}" -o "$tmp/res.jsonl" 2>/dev/null || fail "run -f -o: exit $?"
{ cat "$tmp/res.jsonl"; printf '{"id":"q11","line":11,"text":"garb\n'; cat "$tmp/res.jsonl"; printf '{"torn'; } >"$tmp/res2.jsonl"
cp "$tmp/res2.jsonl" "$tmp/res3.jsonl"
"$tp" "${run_f[@]}" -o "$tmp/res2.jsonl" --resume >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] && grep -q "res2.jsonl: line 2 is not a JSON record" "$tmp/err" && cmp -s "$tmp/res2.jsonl" "$tmp/res3.jsonl" ||
    fail "--resume over a damaged line: exit $rc: $(cat "$tmp/err")"
{ cat "$tmp/res.jsonl"; printf ' \r\n'; } >"$tmp/res4.jsonl" # a blank line is no record
"$tp" "${run_f[@]}" -o "$tmp/res4.jsonl" --resume >/dev/null 2>"$tmp/err" ||
    fail "--resume over a blank line: exit $?: $(cat "$tmp/err")"

# Weights that make the logits NaN (0xff bytes over the last tensors' data): an error that
# says so, in both forms, where the run printed token 0 for every token with exit 0.
python3 -c 'import sys; d = bytearray(open(sys.argv[1], "rb").read()); d[-200000:-100000] = b"\xff" * 100000; open(sys.argv[2], "wb").write(d)' "$m" "$tmp/nan.gguf"
"$tp" run -m "$tmp/nan.gguf" --backend cpu -p Hello -n 4 --temp 0 --json --logprobs 2 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" != 0 ] && grep -q 'logits of generated token 1 are not finite numbers' "$tmp/err" ||
    fail "run -p on NaN weights: exit $rc: $(cat "$tmp/out" "$tmp/err")"
"$tp" run -m "$tmp/nan.gguf" --backend cpu -f "$tmp/p.jsonl" -o "$tmp/nan.out" >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] && grep -q 'generated token 1 are not finite numbers' "$tmp/err" ||
    fail "run -f on NaN weights: exit $rc: $(cat "$tmp/err")"

# A recommended value no option would take is skipped with a warning naming the key.
"$tp" mkmodel -q -o "$tmp/odd.gguf" --sampling top_p=1.5 2>"$tmp/err" || fail "mkmodel top_p=1.5: exit $?"
"$tp" run -m "$tmp/odd.gguf" --backend cpu -p Hello -n 2 >/dev/null 2>"$tmp/err" ||
    fail "run -p with general.sampling.top_p 1.5: exit $?: $(cat "$tmp/err")"
grep -q 'general.sampling.top_p 1.5 is not a value the sampler takes; ignored' "$tmp/err" &&
    ! grep -q 'sampling as the model recommends' "$tmp/err" ||
    fail "run -p: general.sampling.top_p 1.5 not skipped: $(cat "$tmp/err")"

# Rope scaling: a model whose rope.scaling.* keys say YaRN (mkmodel writes them as
# llama.cpp's converter does) gives the logprobs of the same weights run with llama.cpp's
# options; --rope-scaling none turns the file's off; the scaling changes the logprobs.
"$tp" mkmodel -q -o "$tmp/plain.gguf" 2>"$tmp/err" || fail "mkmodel: exit $?: $(cat "$tmp/err")"
"$tp" mkmodel -q -o "$tmp/yarn.gguf" --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 256 \
    2>"$tmp/err" || fail "mkmodel --rope-scaling yarn: exit $?: $(cat "$tmp/err")"
lp() { "$tp" run --backend cpu -p "Hello there, how are you" -n 4 --temp 0 --json --logprobs 3 "$@" 2>"$tmp/err" |
       sed -n 's/.*"logprobs":\(.*\),"token_logprobs".*/\1/p'; }
from_keys=$(lp -m "$tmp/yarn.gguf")
from_opts=$(lp -m "$tmp/plain.gguf" --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 256)
plain=$(lp -m "$tmp/plain.gguf")
[ -n "$from_keys" ] && [ "$from_keys" = "$from_opts" ] ||
    fail "YaRN from the GGUF's keys differs from the options: $from_keys vs $from_opts"
[ "$from_keys" != "$plain" ] || fail "YaRN did not change the logprobs"
[ "$(lp -m "$tmp/yarn.gguf" --rope-scaling none)" = "$plain" ] ||
    fail "--rope-scaling none on a YaRN model is not plain rope"
"$tp" run -m "$tmp/yarn.gguf" --backend cpu -p Hello -n 1 2>"$tmp/err" >/dev/null
grep -q 'rope base 1e+06, yarn x4 from 256' "$tmp/err" || fail "run: YaRN not reported: $(cat "$tmp/err")"
"$tp" run -m "$tmp/plain.gguf" --backend cpu -p Hello --rope-scaling ntk 2>"$tmp/err" >/dev/null
rc=$?
[ "$rc" = 2 ] && grep -q "\-\-rope-scaling expects none, linear or yarn, got 'ntk'" "$tmp/err" ||
    fail "run --rope-scaling ntk: exit $rc: $(cat "$tmp/err")"
# a factor whose inverse is no finite float is an option error, not NaN logits later
"$tp" run -m "$tmp/plain.gguf" --backend cpu -p Hello --rope-scale 1e-40 2>"$tmp/err" >/dev/null
rc=$?
[ "$rc" = 2 ] && grep -q "\-\-rope-scale expects a factor in \[1e-6, 1e6\], got '1e-40'" "$tmp/err" ||
    fail "run --rope-scale 1e-40: exit $rc: $(cat "$tmp/err")"

[ "$n_fail" = 0 ] || exit 1
echo "test_cli_args: sampling options and --seed checked"
