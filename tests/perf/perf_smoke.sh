#!/usr/bin/env bash
# tern-perf runs every test for a few iterations and its output parses: the
# CSV header is exactly the documented one, each row has every column, the
# columns that apply hold positive numbers and the others are empty. No speed
# is asserted here (benchmarks live in perf/).
#   perf_smoke.sh TERN_RUN TERN_PERF
set -euo pipefail
RUN=$1 PERF=$2
HEADER='test,transport,mem,ranks,size,iters,lat_us_p50,lat_us_avg,lat_us_p99,bw_GBps,busbw_GBps,msg_rate'
fail() { echo "FAIL: $*" >&2; exit 1; }

for t in lat bw bibw rate; do
    out=$("$RUN" -n 2 --no-prefix "$PERF" "$t" --sizes 0,8,20k,1M --iters 5 --warmup 1 --window 4 --format csv) \
        || fail "$t: tern-perf exited with $?"
    [ "$(printf '%s\n' "$out" | head -n1)" = "$HEADER" ] || fail "$t: header is '$(printf '%s\n' "$out" | head -n1)'"
    rows=$(printf '%s\n' "$out" | tail -n +2)
    [ "$(printf '%s\n' "$rows" | wc -l)" -eq 4 ] || fail "$t: expected 4 rows, got: $rows"
    printf '%s\n' "$rows" | awk -F, -v t="$t" '
        function num(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ }
        NF != 12 { print "row has " NF " fields: " $0; bad = 1; next }
        $1 != t || $3 != "host" || $4 != 2 || $2 == "" { print "bad identity: " $0; bad = 1 }
        !num($5) || !num($6) || $6 != 5 { print "bad size/iters: " $0; bad = 1 }
        t == "lat" && (!num($7) || !num($8) || !num($9) || $8 <= 0 || $10 != "" || $12 != "") { print "bad lat row: " $0; bad = 1 }
        t != "lat" && ($7 != "" || !num($10) || !num($12) || $12 <= 0) { print "bad bw row: " $0; bad = 1 }
        $11 != "" { print "busbw must be empty for p2p: " $0; bad = 1 }
        END { exit bad }' || fail "$t: malformed CSV"
done

# JSON and the table mention what they measured.
json=$("$RUN" -n 2 --no-prefix "$PERF" lat --sizes 8 --iters 5 --format json)
[[ $json == '{"test":"lat","transport":"'*'"results":[{"size":8,"iters":5,"lat_us_p50":'*']}' ]] || fail "json: $json"
table=$("$RUN" -n 2 --no-prefix "$PERF" bw --sizes 64k --iters 3 --window 2)
grep -q "^# tern-perf bw: transport tcp on " <<<"$table" || fail "table header: $table"

# Bad input is refused clearly.
"$PERF" nosuchtest >/dev/null 2>&1 && fail "unknown test accepted"
err=$("$PERF" lat --mem cuda 2>&1) && fail "--mem cuda accepted"
grep -q "host memory only" <<<"$err" || fail "--mem cuda message: $err"
"$PERF" lat --sizes 8,abc >/dev/null 2>&1 && fail "bad size accepted"
err=$(TERN_RANK=0 TERN_WORLD_SIZE=1 "$PERF" lat 2>&1) && fail "one rank accepted"
grep -q "needs 2 or more ranks" <<<"$err" || fail "one-rank message: $err"
echo "PASS: tern-perf lat, bw, bibw, rate run and parse"
