# Two jobs given one port: job B's ranks reach job A's store before B's rank
# 0 does. The store refuses them (the job token differs), so job A runs whole
# and job B fails saying why, where before each took the other's ranks and
# both exited 0.
# Usage: bash two_jobs.sh TERN_RUN JOB_PROBE
set -euo pipefail
RUN=${1:?usage: $0 TERN_RUN JOB_PROBE}
PROBE=${2:?usage: $0 TERN_RUN JOB_PROBE}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tern-two-jobs.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$TMP"/*.log; do echo "--- $f" >&2; cat "$f" >&2; done
    exit 1
}
export TERN_TRANSPORT=tcp TERN_TIMEOUT=10s
# Job A: rank 0 serves at once, on a port tern-run chose; its others come later.
(JOB=A DELAY=3 TERN_LOG=info "$RUN" -n 3 "$PROBE" >"$TMP/a.log" 2>&1; echo "rc=$?" >>"$TMP/a.log") &
port=
for _ in $(seq 1 100); do
    port=$(sed -nE 's/.*store: serving 3 ranks on 127\.0\.0\.1:([0-9]+).*/\1/p' "$TMP/a.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || fail "job A's store never said its port"
# Job B on the same port: its rank 0 comes late, its others at once.
rc=0
JOB=B DELAY0=1 "$RUN" --master-port "$port" -n 3 "$PROBE" >"$TMP/b.log" 2>&1 || rc=$?
wait
[ "$rc" -ne 0 ] || fail "job B exited 0"
grep -q "another job" "$TMP/b.log" || fail "job B's failure does not say another job's store refused it"
grep -q '^rc=0$' "$TMP/a.log" || fail "job A did not exit 0"
[ "$(grep -c 'of job A joined job A$' "$TMP/a.log")" -eq 3 ] || fail "job A's ranks are not all A's"
if grep -q 'joined job' "$TMP/b.log"; then fail "a rank of job B joined a job"; fi
echo "PASS"
