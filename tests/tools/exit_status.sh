# tern-run exits 0 when every rank does, else with the failing rank's status,
# naming the rank, and stops the others at once.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

run_rc rc "$RUN" -n 4 "$PROBE" exit 0
expect_rc 0 "$rc" "all ranks exit 0"
[ ! -s "$TMP/err" ] || { show; fail "tern-run printed something on success"; }

t0=$(now_ms)
run_rc rc "$RUN" -n 4 "$PROBE" pidfile "$TMP" @2 sleep 0.3 @2 exit 3 sleep 30
elapsed=$(($(now_ms) - t0))
expect_rc 3 "$rc" "rank 2 exits 3"
has "$TMP/err" '^tern-run: rank 2 \(pid [0-9]+\) exited with status 3$' "failure message"
has "$TMP/err" '^tern-run: stopping the other 3 ranks' "stop message"
[ "$elapsed" -lt 10000 ] || fail "took ${elapsed} ms to stop ranks sleeping 30 s"
pid=$(sed -nE 's/^tern-run: rank 2 \(pid ([0-9]+)\).*/\1/p' "$TMP/err")
[ "$pid" = "$(pid_in "$TMP/rank.2.pid")" ] || fail "message names pid $pid, rank 2 was $(cat "$TMP/rank.2.pid")"
for r in 0 1 3; do
    gone "$(pid_in "$TMP/rank.$r.pid")" || fail "rank $r still running after tern-run exited"
done

# Every rank fails the same way: the status is still that one.
run_rc rc "$RUN" -n 3 "$PROBE" exit 5
expect_rc 5 "$rc" "all ranks exit 5"
[ "$(grep -c 'exited with status' "$TMP/err")" -eq 1 ] || { show; fail "expected one failure line"; }

# Output a rank printed before failing comes before the failure line and is kept.
run_rc rc "$RUN" -n 2 "$PROBE" @1 lines 100 @1 exit 9 sleep 30
expect_rc 9 "$rc" "rank 1 exits 9 after output"
[ "$(grep -c '^\[1\] out 1 ' "$TMP/out")" -eq 100 ] || { show; fail "rank 1 output lost"; }
last_err=$(grep -n '^\[1\] err 1 99$' "$TMP/err" | cut -d: -f1)
msg=$(grep -n '^tern-run: rank 1 ' "$TMP/err" | cut -d: -f1)
[ -n "$last_err" ] && [ -n "$msg" ] && [ "$last_err" -lt "$msg" ] || { show; fail "failure line printed before the rank's last output"; }
echo "PASS"
