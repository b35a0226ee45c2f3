#!/usr/bin/env bash
# tern-perf runs every test for a few iterations and its output parses: the
# CSV header is exactly the documented one, each row has every column, the
# columns that apply hold positive numbers and the others are empty; the
# collectives also verify their results (--check); rpc checks its echo. No
# speed is asserted here (benchmarks live in perf/).
#   perf_smoke.sh TERN_RUN TERN_PERF [HAVE_UCX]
set -euo pipefail
RUN=$1 PERF=$2 HAVE_UCX=${3:-0}
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

# --min-size/--max-size: the powers of two between them, each a row.
sizes=$("$RUN" -n 2 --no-prefix "$PERF" lat --min-size 1k --max-size 8k --iters 3 --format csv | tail -n +2 | cut -d, -f5 | paste -sd,)
[ "$sizes" = 1024,2048,4096,8192 ] || fail "--min-size 1k --max-size 8k gave sizes '$sizes'"
# --transport names the provider in use, whatever TERN_TRANSPORT says.
if [ "$HAVE_UCX" = 1 ]; then
    out=$(UCX_TLS=sm "$RUN" -n 2 --no-prefix "$PERF" lat --transport ucx --sizes 8,20k --iters 3 --format csv)
    printf '%s\n' "$out" | tail -n +2 | awk -F, '$2 != "ucx" || $8 <= 0 { bad = 1 } END { exit bad || NR != 2 }' ||
        fail "--transport ucx: $out"
fi

# JSON and the table mention what they measured. Each JSON row and the run
# say how much CPU time the hypervisor took (null when no clock tick passed).
json=$("$RUN" -n 2 --no-prefix "$PERF" lat --sizes 8,16 --iters 5 --format json)
steal='("host_steal_pct":([0-9]+\.[0-9]|null))'
[[ $json =~ ^\{\"test\":\"lat\",\"transport\":\".*\"results\":\[\{\"size\":8,\"iters\":5,\"lat_us_p50\":[^}]*,$steal\},\{\"size\":16,[^}]*,$steal\}\],$steal\}$ ]] ||
    fail "json: $json"
table=$("$RUN" -n 2 --no-prefix "$PERF" bw --sizes 64k --iters 3 --window 2)
# CSV keeps stdout to the fixed header and rows; the provider and its device
# go to stderr, once (rank 0), never into the CSV.
errs=$("$RUN" -n 2 --no-prefix "$PERF" lat --transport tcp --sizes 8 --iters 3 --format csv 2>&1 >/dev/null)
[ "$(grep -c '^# tern-perf lat: transport tcp on .*, mem host, 2 ranks$' <<<"$errs")" = 1 ] ||
    fail "csv: provider and device line on stderr: $errs"
grep -q "^# tern-perf bw: transport tcp on " <<<"$table" || fail "table header: $table"

# Bad input is refused clearly.
"$PERF" nosuchtest >/dev/null 2>&1 && fail "unknown test accepted"
err=$("$PERF" lat --mem cuda 2>&1) && fail "--mem cuda accepted"
grep -q "host memory only" <<<"$err" || fail "--mem cuda message: $err"
"$PERF" lat --sizes 8,abc >/dev/null 2>&1 && fail "bad size accepted"
err=$(TERN_RANK=0 TERN_WORLD_SIZE=1 "$PERF" lat 2>&1) && fail "one rank accepted"
grep -q "needs 2 or more ranks" <<<"$err" || fail "one-rank message: $err"

# rpc: one rpc_lat row per size (round trips; bw both ways, none at size 0;
# sizes above the eager limit go by pull), then one rpc_rate row (size 0,
# calls/s). A third rank only serves.
out=$("$RUN" -n 2 --no-prefix "$PERF" rpc --sizes 0,8,20k,1M --iters 5 --warmup 1 --window 4 --format csv) \
    || fail "rpc: tern-perf exited with $?"
[ "$(printf '%s\n' "$out" | head -n1)" = "$HEADER" ] || fail "rpc: header is '$(printf '%s\n' "$out" | head -n1)'"
printf '%s\n' "$out" | tail -n +2 | awk -F, '
    function num(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ }
    BEGIN { split("0,8,20480,1048576", want, ",") }
    { row++ }
    NF != 12 { print "row has " NF " fields: " $0; bad = 1; next }
    $2 != "tcp" || $3 != "host" || $4 != 2 || $6 != 5 || $11 != "" { print "bad identity/iters: " $0; bad = 1 }
    row <= 4 && ($1 != "rpc_lat" || $5 != want[row] || !num($7) || !num($8) || !num($9) || $8 <= 0 || $12 != "") { print "bad rpc_lat row: " $0; bad = 1 }
    row <= 4 && $5 == 0 && $10 != "" { print "rpc_lat at size 0 has a bandwidth: " $0; bad = 1 }
    row <= 4 && $5 > 0 && !num($10) { print "rpc_lat without a bandwidth: " $0; bad = 1 }
    row == 5 && ($1 != "rpc_rate" || $5 != 0 || $7 != "" || $10 != "" || !num($12) || $12 <= 0) { print "bad rpc_rate row: " $0; bad = 1 }
    END { if (row != 5) { print "expected 5 rows, got " row; bad = 1 } exit bad }' || fail "rpc: malformed CSV: $out"
out=$("$RUN" -n 3 --no-prefix "$PERF" rpc --iters 3 --window 2 --format csv) || fail "rpc at 3 ranks: tern-perf exited with $?"
printf '%s\n' "$out" | tail -n +2 | awk -F, '$4 != 3 { bad = 1 } END { exit bad || NR != 2 }' ||
    fail "rpc at 3 ranks: expected a row of size 8 and a rate row: $out"
json=$("$RUN" -n 2 --no-prefix "$PERF" rpc --iters 3 --window 2 --format json)
[[ $json == '{"test":"rpc","transport":"'*'"window":2,"results":[{"test":"rpc_lat","size":8,"iters":3,"lat_us_p50":'*'"bw_GBps":'*'},{"test":"rpc_rate","size":0,"iters":3,"msg_rate":'*',"host_steal_pct":'*'}],"host_steal_pct":'*'}' ]] || fail "rpc json: $json"
table=$("$RUN" -n 2 --no-prefix "$PERF" rpc --iters 3 --window 2)
grep -q "^# tern-perf rpc: transport tcp on .*, 2 ranks, window 2" <<<"$table" || fail "rpc table header: $table"
grep -q "^rpc_rate " <<<"$table" || fail "rpc table rows: $table"
err=$(TERN_RANK=0 TERN_WORLD_SIZE=1 "$PERF" rpc 2>&1) && fail "rpc at one rank accepted"
grep -q "needs 2 or more ranks" <<<"$err" || fail "rpc one-rank message: $err"

# Collectives: each test at 1, 3 and 4 ranks, its results checked against the
# reference (--check), and its CSV as nccl-tests defines the columns: sizes
# rounded down to what the operation needs, busbw = algbw * the operation's
# factor, msg_rate empty, barrier one row of latencies only.
COLL_SIZES=0,8,1000,100k,1M
coll() { # ranks test [options...]: runs it, prints the CSV
    "$RUN" -n "$1" --no-prefix "$PERF" "$2" --iters 3 --warmup 1 --check --format csv "${@:3}" ||
        fail "$2 at $1 ranks (${*:3}): tern-perf exited with $?"
}
check_coll_csv() { # ranks test elsize requested_sizes csv
    local n=$1 t=$2 es=$3 sizes=$4 out=$5 nrows
    [ "$(printf '%s\n' "$out" | head -n1)" = "$HEADER" ] || fail "$t: header is '$(printf '%s\n' "$out" | head -n1)'"
    nrows=$(printf '%s\n' "$sizes" | tr ',' '\n' | wc -l)
    [ "$t" = barrier ] && nrows=1
    [ "$(printf '%s\n' "$out" | tail -n +2 | wc -l)" -eq "$nrows" ] || fail "$t at $n ranks: expected $nrows rows: $out"
    printf '%s\n' "$out" | tail -n +2 | awk -F, -v t="$t" -v n="$n" -v es="$es" -v sizes="$sizes" '
        function num(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ }
        function req(s) { return s ~ /k$/ ? s * 1024 : s ~ /M$/ ? s * 1048576 : s + 0 }
        BEGIN {
            split(sizes, want, ",")
            per_rank = t ~ /^(allgather|reduce_scatter|alltoall|gather|scatter)$/
            unit = es * (per_rank ? n : 1)
            f = t == "allreduce" ? 2 * (n - 1) / n : t ~ /^(broadcast|reduce)$/ ? 1 : (n - 1) / n
        }
        { row++ }
        NF != 12 { print "row has " NF " fields: " $0; bad = 1; next }
        $1 != t || $2 != "tcp" || $3 != "host" || $4 != n { print "bad identity: " $0; bad = 1 }
        $6 != 3 || !num($7) || !num($8) || !num($9) || $12 != "" { print "bad iters/latency/msg_rate: " $0; bad = 1 }
        t == "barrier" && ($5 != 0 || $10 != "" || $11 != "") { print "barrier has a size or bandwidth: " $0; bad = 1 }
        t != "barrier" && $5 != int(req(want[row]) / unit) * unit { print "size " $5 " for " want[row] " (unit " unit "): " $0; bad = 1 }
        t != "barrier" && (!num($10) || !num($11)) { print "bad bandwidth: " $0; bad = 1 }
        t != "barrier" && ($11 - $10 * f > 0.002 || $10 * f - $11 > 0.002) { print "busbw is not algbw * " f ": " $0; bad = 1 }
        END { exit bad }' || fail "$t at $n ranks: malformed CSV"
}
for n in 1 3 4; do
    for t in allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter barrier; do
        extra=()
        case $t in broadcast | reduce | gather | scatter) extra=(--root $((n - 1))) ;; esac
        check_coll_csv "$n" "$t" 4 "$COLL_SIZES" "$(coll "$n" "$t" --sizes "$COLL_SIZES" "${extra[@]}")"
    done
done
# Other dtypes and ops, checked the same way.
for spec in "allreduce f16 prod 2" "allreduce bf16 avg 2" "allreduce i8 max 1" "allreduce bool sum 1" \
    "allreduce f64 avg 8" "reduce u8 min 1 2" "reduce_scatter i64 sum 8" "reduce_scatter bf16 max 2"; do
    # shellcheck disable=SC2086 # the words of spec are the arguments
    set -- $spec
    check_coll_csv 3 "$1" "$4" 8,100k "$(coll 3 "$1" --sizes 8,100k --dtype "$2" --op "$3" ${5:+--root "$5"})"
done
# In place (one buffer, as torch.distributed's all_reduce), checked the same way.
for n in 2 3; do
    check_coll_csv "$n" allreduce 4 "$COLL_SIZES" "$(coll "$n" allreduce --sizes "$COLL_SIZES" --inplace)"
done

# The table and JSON say what a collective measured.
json=$("$RUN" -n 2 --no-prefix "$PERF" allreduce --sizes 8 --iters 3 --format json --dtype bf16 --op max)
[[ $json == '{"test":"allreduce","transport":"'*'"ranks":2,"dtype":"bf16","op":"max","results":[{"size":8,"iters":3,"lat_us_p50":'*'"busbw_GBps":'*',"host_steal_pct":'*'}],"host_steal_pct":'*'}' ]] || fail "collective json: $json"
table=$("$RUN" -n 2 --no-prefix "$PERF" allreduce --sizes 64k --iters 3 --inplace)
grep -q "^# tern-perf allreduce: transport tcp on .*, 2 ranks, f32 sum, in place$" <<<"$table" ||
    fail "in-place table header: $table"
table=$("$RUN" -n 2 --no-prefix "$PERF" broadcast --sizes 64k --iters 3 --root 1 --check)
grep -q "^# tern-perf broadcast: transport tcp on .*, 2 ranks, f32, root 1$" <<<"$table" || fail "collective table header: $table"
grep -q "busbw_GBps" <<<"$table" || fail "collective table columns: $table"
grep -q "^# --check: every rank's results matched" <<<"$table" || fail "collective table check line: $table"

# --traffic sets the calls per size: 1 MiB / 64 KiB = 16, and never fewer than 10.
iters=$("$RUN" -n 2 --no-prefix "$PERF" allreduce --sizes 64k,1M --traffic 1M --format csv | tail -n +2 | cut -d, -f6 | paste -sd,)
[ "$iters" = 16,10 ] || fail "--traffic 1M at 64k,1M gave iters '$iters'"

# Bad collective input is refused before anything runs.
err=$("$PERF" allreduce --traffic 0 2>&1) && fail "--traffic 0 accepted"
grep -q "bad traffic" <<<"$err" || fail "--traffic 0 message: $err"
err=$("$PERF" lat --traffic 1M 2>&1) && fail "--traffic accepted for lat"
grep -q "collective tests only" <<<"$err" || fail "--traffic for lat message: $err"
err=$("$PERF" allreduce --op avg --dtype i32 2>&1) && fail "avg of i32 accepted"
grep -q "floating" <<<"$err" || fail "avg of i32 message: $err"
err=$("$PERF" lat --dtype f64 2>&1) && fail "--dtype accepted for lat"
grep -q "collective tests only" <<<"$err" || fail "--dtype for lat message: $err"
"$PERF" allreduce --op nosuchop >/dev/null 2>&1 && fail "unknown op accepted"
err=$("$PERF" reduce --inplace 2>&1) && fail "--inplace accepted for reduce"
grep -q "inplace is for allreduce" <<<"$err" || fail "--inplace for reduce message: $err"
err=$("$RUN" -n 2 --no-prefix "$PERF" gather --root 2 2>&1) && fail "root outside the ranks accepted"
grep -q "not a rank" <<<"$err" || fail "bad root message: $err"
# Options: each mistake named as what it is.
err=$("$PERF" lat --frobnicate 2>&1) && fail "unknown last option accepted"
grep -q "unknown option '--frobnicate'" <<<"$err" || fail "unknown last option message: $err"
err=$("$PERF" lat --iters 2>&1) && fail "--iters without a value accepted"
grep -q "needs a value" <<<"$err" || fail "missing value message: $err"
"$PERF" lat --sizes '' >/dev/null 2>&1 && fail "empty --sizes accepted"
"$PERF" lat --warmup '' >/dev/null 2>&1 && fail "empty --warmup accepted"
"$PERF" lat --sizes 18446744073709551615 >/dev/null 2>&1 && fail "a size that wraps accepted"
err=$("$PERF" lat --sizes 8 --max-size 16 2>&1) && fail "--sizes with --max-size accepted"
grep -q "give one" <<<"$err" || fail "--sizes with --max-size message: $err"
err=$("$PERF" lat --max-size 0 2>&1) && fail "empty size range accepted"
grep -q "min-size 1 is above --max-size 0" <<<"$err" || fail "empty range message: $err"
# --warmup 0 means none, and p99 of 3 samples is the largest: p50 <= avg... <= p99.
out=$("$RUN" -n 2 --no-prefix "$PERF" lat --sizes 8 --iters 3 --warmup 0 --format csv) ||
    fail "--warmup 0 refused"
tail -n 1 <<<"$out" | awk -F, '$7 > $9 { exit 1 }' || fail "lat p50 above p99: $out"
# A size one rank cannot allocate ends the run at once, on every rank.
# (Under AddressSanitizer such a malloc aborts unless told to return NULL.)
err=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" TERN_TIMEOUT=60s \
    "$RUN" -n 3 --no-prefix "$PERF" lat --sizes 4611686018427387903 --format csv 2>&1) &&
    fail "a buffer nobody can allocate accepted"
grep -q "out of memory on this rank" <<<"$err" || fail "allocation failure message: $err"
echo "PASS: tern-perf lat, bw, bibw, rate, rpc and the collectives run, check and parse"
