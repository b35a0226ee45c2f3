# A rank killed by a signal: tern-run names the rank and the signal, exits
# 128+signal, and the other ranks (and what they started) are gone soon after,
# with SIGKILL for those that ignore SIGTERM.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

t0=$(now_ms)
run_rc rc "$RUN" -n 3 "$PROBE" pidfile "$TMP" fork "$TMP" @1 sleep 0.3 @1 crash sleep 30
elapsed=$(($(now_ms) - t0))
expect_rc 139 "$rc" "rank 1 crashes"
has "$TMP/err" '^tern-run: rank 1 \(pid [0-9]+\) was killed by signal 11 \(Segmentation fault\)' "crash message"
[ "$elapsed" -lt 10000 ] || fail "took ${elapsed} ms to stop ranks sleeping 30 s"
for r in 0 1 2; do
    gone "$(pid_in "$TMP/rank.$r.pid")" || fail "rank $r still running after tern-run exited"
    gone "$(pid_in "$TMP/child.$r.pid")" || fail "the child rank $r started is still running"
done

# Ranks that ignore SIGTERM are killed after --kill-grace.
rm -f "$TMP"/*.pid
t0=$(now_ms)
run_rc rc "$RUN" --kill-grace 1s -n 3 "$PROBE" pidfile "$TMP" ignoreterm @0 sleep 0.3 @0 crash sleep 30
elapsed=$(($(now_ms) - t0))
expect_rc 139 "$rc" "crash with SIGTERM ignored"
has "$TMP/err" '^tern-run: rank 0 \(pid [0-9]+\) was killed by signal 11' "crash message"
has "$TMP/err" '^tern-run: 2 ranks still running 1s after SIGTERM; sending SIGKILL$' "SIGKILL message"
[ "$elapsed" -ge 1000 ] || fail "SIGKILL came after ${elapsed} ms, before the 1 s grace"
[ "$elapsed" -lt 8000 ] || fail "took ${elapsed} ms with a 1 s grace"
for r in 0 1 2; do
    gone "$(pid_in "$TMP/rank.$r.pid")" || fail "rank $r still running after tern-run exited"
done

# A rank that exits 0 but leaves a child: one holding its stdout (fork), which
# tern-run does not wait 60 s for, and one holding none of its pipes (detach),
# which ends with the job's process groups, as a Slurm step's processes do.
# Neither is left behind.
for how in fork detach; do
    rm -f "$TMP"/*.pid
    t0=$(now_ms)
    run_rc rc "$RUN" -n 2 "$PROBE" "$how" "$TMP" echo done
    elapsed=$(($(now_ms) - t0))
    expect_rc 0 "$rc" "rank leaving a child ($how)"
    [ "$(grep -c '^\[[01]\] done$' "$TMP/out")" -eq 2 ] || { show; fail "output lost ($how)"; }
    [ "$elapsed" -lt 8000 ] || fail "waited ${elapsed} ms for a rank's leftover child ($how)"
    for r in 0 1; do
        gone "$(pid_in "$TMP/child.$r.pid")" || fail "rank $r's leftover child still running ($how)"
    done
done
echo "PASS"
