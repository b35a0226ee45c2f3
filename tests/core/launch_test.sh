#!/usr/bin/env bash
# Start store_ranks the way each launcher would and check that every rank
# joined, agreed and finished.
#   launch_test.sh MODE STORE_RANKS [TERN_RUN]
# MODE: tern-run | mpirun | torchrun | slurm | pmi
set -euo pipefail
mode=$1 prog=$2 ternrun=${3:-}
n=4
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() { echo "FAIL ($mode): $*" >&2; echo "--- output:" >&2; cat "$out" >&2; exit 1; }

# Start n ranks with per-rank variables made by a function, wait for all.
spawn() {
    local setvars=$1 port pids=() rc=0
    port=$("$prog" --free-port)
    for ((r = 0; r < n; r++)); do
        (eval "$($setvars "$r")"; export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
         exec timeout 60 "$prog" --expect-world $n --expect-launcher "$launcher") >>"$out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    [ "$rc" -eq 0 ] || fail "a rank exited with $rc"
}
torchrun_vars() { echo "export RANK=$1 WORLD_SIZE=$n LOCAL_RANK=$1 LOCAL_WORLD_SIZE=$n"; }
slurm_vars() { echo "export SLURM_PROCID=$1 SLURM_NTASKS=$n SLURM_LOCALID=$1"; }
pmi_vars() { echo "export PMI_RANK=$1 PMI_SIZE=$n"; }  # local ranks found through the store

case $mode in
tern-run)
    launcher='TERN_*'
    "$ternrun" -n $n --timeout 60s "$prog" --expect-world $n --expect-launcher "$launcher" >"$out" 2>&1 \
        || fail "tern-run exited with $?"
    for ((r = 0; r < n; r++)); do
        grep -q "^\[$r\] rank $r/$n ok launcher=TERN_\* local=$r/$n$" "$out" || fail "no ok line from rank $r"
    done
    ;;
mpirun)
    command -v mpirun >/dev/null || { echo "mpirun not installed"; exit 77; }
    launcher='Open MPI'
    root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    port=$("$prog" --free-port)
    timeout 120 mpirun "${root[@]}" --oversubscribe -np $n -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
        -x TERN_LOG "$prog" --expect-world $n --expect-launcher "$launcher" >"$out" 2>&1 \
        || fail "mpirun exited with $?"
    ;;
torchrun) launcher=torchrun; spawn torchrun_vars ;;
slurm) launcher=Slurm; spawn slurm_vars ;;
pmi) launcher=PMI; spawn pmi_vars ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
for ((r = 0; r < n; r++)); do
    grep -qF "rank $r/$n ok launcher=$launcher local=" "$out" || fail "rank $r did not report ok"
done
[ "$(grep -cF " ok launcher=" "$out")" -eq $n ] || fail "expected exactly $n ok lines"
echo "PASS ($mode): $n ranks"
