# Bad programs and bad arguments: one clear message, a distinct exit status.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# usage_err "regex" args...: tern-run exits 2 with that message.
usage_err() {
    local re=$1
    shift
    run_rc rc "$RUN" "$@"
    expect_rc 2 "$rc" "tern-run $*"
    has "$TMP/err" "^tern-run: $re" "tern-run $*"
    has "$TMP/err" "^Try 'tern-run --help'" "tern-run $*: hint"
    [ ! -s "$TMP/out" ] || { show; fail "tern-run $*: printed on stdout"; }
}

run_rc rc "$RUN" -n 2 "$TMP/no-such-program" arg
expect_rc 127 "$rc" "missing program"
[ "$(cat "$TMP/err")" = "tern-run: cannot run '$TMP/no-such-program': No such file or directory" ] ||
    { show; fail "missing program message"; }
run_rc rc "$RUN" -n 2 tern-run-no-such-program-in-path
expect_rc 127 "$rc" "program not in PATH"
has "$TMP/err" "^tern-run: cannot run 'tern-run-no-such-program-in-path': No such file or directory$" "PATH lookup"
printf '#!/bin/sh\necho hi\n' >"$TMP/not-executable"
chmod 644 "$TMP/not-executable"
run_rc rc "$RUN" -n 2 "$TMP/not-executable"
expect_rc 126 "$rc" "not executable"
has "$TMP/err" "^tern-run: cannot run '.*/not-executable': Permission denied$" "not executable"
[ "$(grep -c 'cannot run' "$TMP/err")" -eq 1 ] || { show; fail "exec failure reported more than once"; }

usage_err "-n: 0 is out of range \[1, 4096\]$" -n 0 "$PROBE"
usage_err "-n: 'abc' is not an integer$" -n abc "$PROBE"
usage_err "--nproc: 5000 is out of range" --nproc 5000 "$PROBE"
usage_err "option '-n' needs a value$" -n
usage_err "missing program to run$" -n 2
usage_err "missing program to run$"
usage_err "missing -n N" "$PROBE"
usage_err "unknown option '--frobnicate'$" --frobnicate -n 2 "$PROBE"
usage_err "unknown option '-x'$" -x
usage_err "option '--no-prefix' takes no value$" --no-prefix=yes -n 1 "$PROBE"
usage_err "--timeout: 'soon' is not a duration" --timeout soon -n 1 "$PROBE"
usage_err "--kill-grace: '5 parsecs': unknown unit" --kill-grace "5 parsecs" -n 1 "$PROBE"
usage_err "--master-port: 70000 is out of range" --master-port 70000 -n 1 "$PROBE"
usage_err "--markdown only goes with --help-env$" --markdown
usage_err "--help-env takes no program" --help-env "$PROBE"
usage_err "--help-env and --topology cannot be combined$" --help-env --topology
echo "PASS"
