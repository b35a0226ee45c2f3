# Signals sent to tern-run reach every rank.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# Empty the output files before a background start: the job's own redirection
# truncates them only once its shell gets to run, and until then wait_for
# would count the previous job's "ready" lines and signal a job that has not
# set up its handlers yet (seen once in 300 runs under ctest -j2).
fresh() {
    : >"$TMP/out"
    : >"$TMP/err"
}

# start ARGS...: run tern-run in the background; its pid in $job.
start() {
    fresh
    "$RUN" "$@" >"$TMP/out" 2>"$TMP/err" &
    job=$!
}

finish() { # expected-status what
    local rc=0
    wait "$job" || rc=$?
    expect_rc "$1" "$rc" "$2"
}

# SIGTERM is forwarded, and ends the job: tern-run exits 128+15, killing the
# ranks that are still running after the grace.
start --kill-grace 1s -n 3 "$PROBE" waitsig sleep 30
wait_for "$TMP/out" 'ready$' 3 10
kill -TERM "$job"
finish 143 "SIGTERM"
for r in 0 1 2; do
    has "$TMP/out" "^\[$r\] rank $r got SIGTERM$" "rank $r got SIGTERM"
done
has "$TMP/err" '^tern-run: received SIGTERM; forwarded it to 3 ranks$' "SIGTERM message"
has "$TMP/err" '^tern-run: 3 ranks still running 1s after SIGTERM; sending SIGKILL$' "SIGKILL after the grace"

# SIGUSR1 is forwarded and the job goes on.
start -n 2 "$PROBE" waitsig echo finished
wait_for "$TMP/out" 'ready$' 2 10
kill -USR1 "$job"
finish 0 "SIGUSR1"
for r in 0 1; do
    has "$TMP/out" "^\[$r\] rank $r got SIGUSR1$" "rank $r got SIGUSR1"
    has "$TMP/out" "^\[$r\] finished$" "rank $r went on after SIGUSR1"
done

# SIGHUP: the ranks that catch it and exit 0 still leave tern-run's 128+1.
start -n 2 "$PROBE" waitsig
wait_for "$TMP/out" 'ready$' 2 10
kill -HUP "$job"
finish 129 "SIGHUP"
has "$TMP/out" '^\[1\] rank 1 got SIGHUP$' "rank 1 got SIGHUP"

# The default action: ranks that do not catch SIGTERM die of it.
start -n 2 "$PROBE" pidfile "$TMP" sleep 30
deadline=$(($(now_ms) + 10000))
while [ ! -s "$TMP/rank.0.pid" ] || [ ! -s "$TMP/rank.1.pid" ]; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "ranks did not start"
    sleep 0.05
done
kill -TERM "$job"
finish 143 "SIGTERM to sleeping ranks"
gone "$(pid_in "$TMP/rank.0.pid")" || fail "rank 0 survived SIGTERM"
gone "$(pid_in "$TMP/rank.1.pid")" || fail "rank 1 survived SIGTERM"
# SIGINT (Ctrl-C): a background job of a non-interactive shell starts with
# SIGINT ignored, so give tern-run the default action as a terminal would.
if env --default-signal=INT true 2>/dev/null; then
    fresh
    env --default-signal=INT "$RUN" -n 2 "$PROBE" waitsig >"$TMP/out" 2>"$TMP/err" &
    job=$!
    wait_for "$TMP/out" 'ready$' 2 10
    kill -INT "$job"
    finish 130 "SIGINT"
    has "$TMP/out" '^\[0\] rank 0 got SIGINT$' "rank 0 got SIGINT"
    has "$TMP/out" '^\[1\] rank 1 got SIGINT$' "rank 1 got SIGINT"
    # Ctrl-C in a shell loop: the terminal sends SIGINT to the whole
    # foreground group, and bash stops the loop only if its child died of
    # SIGINT (it waits to see: "wait and cooperative exit"). tern-run, told
    # to stop by SIGINT, ends by SIGINT too; it used to exit 130, and the
    # loop went on to its next turn.
    if command -v setsid >/dev/null; then
        fresh
        setsid env --default-signal=INT bash -c 'for i in 1 2; do "$0" -n 1 "$1" waitsig; echo "turn $i ended: $?"; done; echo "loop finished"' \
            "$RUN" "$PROBE" >"$TMP/out" 2>"$TMP/err" &
        job=$!
        wait_for "$TMP/out" 'ready$' 1 10
        kill -INT -- -"$job"
        finish 130 "a shell loop given Ctrl-C"
        lacks "$TMP/out" 'turn 1 ended' "the loop went on after Ctrl-C"
        lacks "$TMP/out" 'loop finished' "the loop finished after Ctrl-C"
    fi
else
    echo "note: env --default-signal unsupported; SIGINT forwarding not tested"
fi

# A signal ignored when tern-run starts (as under nohup) stays ignored, for
# tern-run and the ranks: the job goes on.
fresh
(trap '' HUP && exec "$RUN" -n 2 "$PROBE" waitsig echo finished) >"$TMP/out" 2>"$TMP/err" &
job=$!
wait_for "$TMP/out" 'ready$' 2 10
kill -HUP "$job"
sleep 0.2
kill -USR1 "$job"
finish 0 "SIGHUP ignored at start, then SIGUSR1"
lacks "$TMP/out" 'got SIGHUP' "SIGHUP was ignored"
# Ctrl-Z: SIGTSTP to tern-run stops the ranks (and what they started) and
# tern-run; SIGCONT continues them all. The terminal's SIGTSTP reaches only
# tern-run, whose ranks are in other process groups: they used to run on
# behind a stopped tern-run. Time stopped does not count against --timeout:
# stopped 5 s, a 4 s timeout has not run out when the job continues.
state() { awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo gone; }
until_state() { # pid regex what
    local deadline=$(($(now_ms) + 10000))
    until [[ "$(state "$1")" =~ $2 ]]; do
        [ "$(now_ms)" -lt "$deadline" ] || { show; fail "$3: pid $1 in state $(state "$1")"; }
        sleep 0.05
    done
}
# job_in regex what: tern-run, both ranks and each rank's child in a state.
job_in() {
    until_state "$job" "$1" "tern-run $2"
    for r in 0 1; do
        until_state "$(pid_in "$TMP/rank.$r.pid")" "$1" "rank $r $2"
        until_state "$(pid_in "$TMP/child.$r.pid")" "$1" "rank $r's child $2"
    done
}
rm -f "$TMP"/rank.*.pid "$TMP"/child.*.pid
start --timeout 4s -n 2 "$PROBE" pidfile "$TMP" detach "$TMP" waitsig echo finished
wait_for "$TMP/out" 'ready$' 2 10
kill -TSTP "$job"
job_in '^T$' "stopped on SIGTSTP"
sleep 5
kill -CONT "$job"
job_in '^[RS]$' "continued on SIGCONT"
kill -USR1 "$job"
finish 0 "SIGTSTP, then SIGCONT"
has "$TMP/out" '^\[0\] finished$' "rank 0 finished after SIGCONT"
has "$TMP/out" '^\[1\] finished$' "rank 1 finished after SIGCONT"
lacks "$TMP/err" 'timed out' "time stopped counted against --timeout"
echo "PASS"
