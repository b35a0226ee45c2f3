# Every rank gets its own TERN_RANK/TERN_LOCAL_RANK, the job's sizes, and the
# same MASTER_ADDR/MASTER_PORT; the parent's environment passes through.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

run_rc rc "$RUN" -n 4 "$PROBE" env
expect_rc 0 "$rc" "-n 4 env"
[ "$(wc -l <"$TMP/out")" -eq 4 ] || { show; fail "expected 4 lines, one per rank"; }
for r in 0 1 2 3; do
    has "$TMP/out" "^\[$r\] rank=$r world=4 local=$r local_world=4 addr=127\.0\.0\.1 port=[0-9]+$" "rank $r env"
done
ports=$(sed -E 's/.* port=//' "$TMP/out" | sort -u)
[ "$(echo "$ports" | wc -l)" -eq 1 ] || fail "ranks disagree on MASTER_PORT: $ports"
[ "$ports" -ge 1 ] && [ "$ports" -le 65535 ] || fail "MASTER_PORT $ports out of range"

run_rc rc "$RUN" --master-port 29876 -n 2 "$PROBE" env
expect_rc 0 "$rc" "--master-port"
[ "$(grep -c ' port=29876$' "$TMP/out")" -eq 2 ] || { show; fail "--master-port 29876 not given to both ranks"; }

# Variables tern-run sets replace the parent's; everything else is inherited.
run_rc rc env TERN_RANK=99 TERN_WORLD_SIZE=99 MASTER_ADDR=10.9.9.9 MASTER_PORT=1 \
    TERN_RUN_TEST_VAR='a b=c' "$RUN" -n 2 "$PROBE" env getenv TERN_RUN_TEST_VAR
expect_rc 0 "$rc" "overridden env"
has "$TMP/out" '^\[0\] rank=0 world=2 local=0 local_world=2 addr=127\.0\.0\.1 port=[0-9]+$' "override rank 0"
has "$TMP/out" '^\[1\] rank=1 world=2 local=1 local_world=2 addr=127\.0\.0\.1 port=[0-9]+$' "override rank 1"
lacks "$TMP/out" 'port=1$' "parent MASTER_PORT must be replaced"
[ "$(grep -c '^\[[01]\] TERN_RUN_TEST_VAR=a b=c$' "$TMP/out")" -eq 2 ] || { show; fail "parent variable not inherited"; }
[ "$(grep -c 'TERN_RANK=' "$TMP/out" || true)" -eq 0 ] || fail "stray output"

# TERN_MASTER_* (which tern takes before MASTER_*) and torchrun's agent-store
# flag left in the parent's environment would send the ranks to another
# store: tern-run sets the first two and drops the third.
run_rc rc env TERN_MASTER_PORT=29555 TERN_MASTER_ADDR=10.9.9.9 TORCHELASTIC_USE_AGENT_STORE=1 \
    "$RUN" --master-port 29877 -n 2 "$PROBE" env getenv TERN_MASTER_PORT getenv TERN_MASTER_ADDR \
    getenv TORCHELASTIC_USE_AGENT_STORE
expect_rc 0 "$rc" "inherited TERN_MASTER_*"
[ "$(grep -c '^\[[01]\] TERN_MASTER_PORT=29877$' "$TMP/out")" -eq 2 ] || { show; fail "TERN_MASTER_PORT not set to the job's port"; }
[ "$(grep -c '^\[[01]\] TERN_MASTER_ADDR=127\.0\.0\.1$' "$TMP/out")" -eq 2 ] || { show; fail "TERN_MASTER_ADDR not set"; }
lacks "$TMP/out" 'TORCHELASTIC_USE_AGENT_STORE=1' "TORCHELASTIC_USE_AGENT_STORE must be dropped"

# Program arguments that look like options belong to the program.
run_rc rc "$RUN" -n 1 -- "$PROBE" echo --help
expect_rc 0 "$rc" "-- separator"
has "$TMP/out" '^\[0\] --help$' "argument after --"
run_rc rc "$RUN" --nproc=2 "$PROBE" echo -n
expect_rc 0 "$rc" "--nproc=2"
[ "$(grep -c '^\[[01]\] -n$' "$TMP/out")" -eq 2 ] || { show; fail "program option -n passed through"; }
# The ranks inherit no descriptor of tern-run's own (other ranks' pipes, its
# signal pipe): they have what tern-run was given, no more.
own=$("$PROBE" fds)
run_rc rc "$RUN" -n 3 "$PROBE" fds
expect_rc 0 "$rc" "fds"
[ "$(grep -cxF -e "[0] $own" -e "[1] $own" -e "[2] $own" "$TMP/out")" -eq 3 ] ||
    { show; fail "ranks have other descriptors than '$own'"; }
echo "PASS"
