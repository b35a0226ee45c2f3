# Shared by the tern-run tests: sourced after "set -euo pipefail".
# Usage of every test: bash test.sh TERN_RUN RANK_PROBE
RUN=${1:?usage: $0 TERN_RUN RANK_PROBE}
PROBE=${2:?usage: $0 TERN_RUN RANK_PROBE}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tern-run-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# A command failing under set -e would otherwise end the test without a word.
set -E
trap 'echo "FAIL: $(basename "$0") line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# Milliseconds of a monotonic-enough clock, for elapsed-time bounds.
now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

# run_rc VAR cmd...: run cmd with stdout/stderr in $TMP/out, $TMP/err, and set VAR to its status.
run_rc() {
    local __var=$1
    shift
    local __rc=0
    "$@" >"$TMP/out" 2>"$TMP/err" || __rc=$?
    printf -v "$__var" '%s' "$__rc"
}

expect_rc() { # expected actual what
    [ "$2" = "$1" ] || { show; fail "$3: exit status $2, expected $1"; }
}

# has FILE REGEX what: FILE has a line matching the extended REGEX.
has() {
    grep -Eq -- "$2" "$1" || { show; fail "$3: no line matching /$2/ in $(basename "$1")"; }
}

lacks() {
    if grep -Eq -- "$2" "$1"; then show; fail "$3: unexpected line matching /$2/ in $(basename "$1")"; fi
}

show() {
    echo "---- stdout (first 40 lines)" >&2
    head -n 40 "$TMP/out" >&2 || true
    echo "---- stderr (first 40 lines)" >&2
    head -n 40 "$TMP/err" >&2 || true
    echo "----" >&2
}

# gone PID: the process no longer exists (a zombie left to an init that does
# not reap counts as gone: it is dead).
gone() {
    [[ "$1" =~ ^[0-9]+$ ]] || fail "gone: '$1' is not a pid"
    kill -0 "$1" 2>/dev/null || return 0
    [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]
}

# pid_in FILE: the pid a probe wrote with "pidfile" or "fork".
pid_in() {
    [ -s "$1" ] || fail "no pid file $(basename "$1"): the process never got that far"
    cat "$1"
}

# wait_for FILE REGEX COUNT SECONDS: until FILE has COUNT lines matching REGEX.
wait_for() {
    local deadline=$(($(now_ms) + $4 * 1000))
    while [ "$(grep -Ec -- "$2" "$1" 2>/dev/null || true)" -lt "$3" ]; do
        [ "$(now_ms)" -lt "$deadline" ] || { show; fail "waited $4 s for $3 lines /$2/ in $(basename "$1")"; }
        sleep 0.05
    done
}
