# A reaped rank's pid, which was also its process group id, may go to an
# unrelated process that makes itself a group leader. Ending the job must not
# signal that group. A pid namespace of our own makes the reuse happen on
# demand: ns_last_pid says which pid the next fork gets.
set -euo pipefail
if [ "${TERN_TEST_PIDNS:-}" != 1 ]; then
    if ! unshare -p -f --mount-proc true 2>/dev/null; then
        echo "SKIP: cannot make a pid namespace here (needs root)"
        exit 77
    fi
    exec unshare -p -f --mount-proc env TERN_TEST_PIDNS=1 bash "$0" "$@"
fi
. "$(dirname "$0")/lib.sh"

mkfifo "$TMP/go"
# Rank 1 leaves at once; rank 0 stays until the test writes to the fifo (a
# blocking read, so no rank forks while the test arranges the reuse).
"$RUN" -n 2 bash -c 'if [ "$TERN_RANK" = 1 ]; then echo $$ >"$0/rank1.pid"; exit 0; fi
read -r x <"$0/go"; echo rank 0 done' "$TMP" >"$TMP/out" 2>"$TMP/err" &
job=$!

deadline=$(($(now_ms) + 10000))
while [ ! -s "$TMP/rank1.pid" ]; do
    [ "$(now_ms)" -lt "$deadline" ] || { show; fail "rank 1 did not start"; }
    sleep 0.05
done
p1=$(cat "$TMP/rank1.pid")
while [ -e "/proc/$p1" ]; do # exited and reaped by tern-run
    [ "$(now_ms)" -lt "$deadline" ] || { show; fail "rank 1 (pid $p1) was not reaped"; }
    sleep 0.05
done

echo $((p1 - 1)) >/proc/sys/kernel/ns_last_pid
setsid sleep 60 &
other=$!
[ "$other" = "$p1" ] || fail "could not arrange the reuse: the new process got pid $other, not $p1"
deadline=$(($(now_ms) + 10000))
until [ "$(awk '{print $5}' "/proc/$other/stat")" = "$other" ]; do # setsid ran
    [ "$(now_ms)" -lt "$deadline" ] || fail "pid $other did not become a group leader"
    sleep 0.05
done

echo go >"$TMP/go"
rc=0
wait "$job" || rc=$?
expect_rc 0 "$rc" "the job"
has "$TMP/out" '^\[0\] rank 0 done$' "rank 0 finished"
if gone "$other"; then
    fail "tern-run killed process group $other, which took the pid of rank 1 after it was reaped"
fi
kill "$other"
wait "$other" 2>/dev/null || true
