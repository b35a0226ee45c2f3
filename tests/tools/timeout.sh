# --timeout stops a job that runs too long and exits 124.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

t0=$(now_ms)
run_rc rc "$RUN" --timeout 1s -n 2 "$PROBE" pidfile "$TMP" sleep 30
elapsed=$(($(now_ms) - t0))
expect_rc 124 "$rc" "--timeout 1s"
has "$TMP/err" '^tern-run: timed out after 1s; stopping 2 ranks$' "timeout message"
[ "$elapsed" -ge 1000 ] || fail "stopped after ${elapsed} ms, before the timeout"
[ "$elapsed" -lt 8000 ] || fail "took ${elapsed} ms to stop after a 1 s timeout"
gone "$(pid_in "$TMP/rank.0.pid")" || fail "rank 0 still running"
gone "$(pid_in "$TMP/rank.1.pid")" || fail "rank 1 still running"

# Ranks that ignore SIGTERM are killed after the grace; still 124.
rm -f "$TMP"/*.pid
run_rc rc "$RUN" --timeout 500ms --kill-grace 300ms -n 2 "$PROBE" pidfile "$TMP" ignoreterm sleep 30
expect_rc 124 "$rc" "--timeout with SIGTERM ignored"
has "$TMP/err" '^tern-run: 2 ranks still running 300ms after SIGTERM; sending SIGKILL$' "SIGKILL after the grace"
gone "$(pid_in "$TMP/rank.0.pid")" || fail "rank 0 still running"
gone "$(pid_in "$TMP/rank.1.pid")" || fail "rank 1 still running"

# A job that ends in time is not affected.
run_rc rc "$RUN" --timeout 30s -n 2 "$PROBE" echo ok
expect_rc 0 "$rc" "job within its timeout"
[ "$(grep -c '^\[[01]\] ok$' "$TMP/out")" -eq 2 ] || { show; fail "output"; }
echo "PASS"
