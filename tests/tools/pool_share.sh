# Ranks pinned to the same cores share them. Under a launcher that binds
# several ranks to one socket or NUMA node (mpirun's default beyond two ranks,
# srun --cpu-bind=sockets), each rank used to start a full pool bound to the
# same cores. tern_init now counts, through the store, the ranks on exactly its
# cores. Here taskset stands in for the launcher. Usage: pool_share.sh TERN_RUN JOB_PROBE
set -euo pipefail
. "$(dirname "$0")/lib.sh"
export TERN_LOG=info

# summary R: rank R's pool summary
summary() { grep -E "^\[$1\] .*pool: " "$TMP/err" | head -n 1; }

run_rc rc taskset -c 0 "$RUN" -n 2 "$PROBE"
expect_rc 0 "$rc" "two ranks pinned to one core"
for r in 0 1; do
    summary "$r" | grep -q "shared by 2 ranks on the launcher's cores" ||
        { show; fail "rank $r pinned with another: $(summary "$r")"; }
done

if [ "$(nproc)" -ge 2 ]; then
    # Each rank its own core: nobody shares, the launcher's core is whole.
    run_rc rc "$RUN" --bind-to core -n 2 "$PROBE"
    expect_rc 0 "$rc" "--bind-to core"
    for r in 0 1; do
        summary "$r" | grep -q "cores given by the launcher" ||
            { show; fail "rank $r bound to its own core: $(summary "$r")"; }
    done
    # Unpinned, local ranks slice the cores in local-rank order, as before.
    run_rc rc "$RUN" -n 2 "$PROBE"
    expect_rc 0 "$rc" "unpinned"
    for r in 0 1; do
        summary "$r" | grep -q "local rank $r of 2" ||
            { show; fail "rank $r unpinned: $(summary "$r")"; }
    done
else
    echo "note: one core here; --bind-to core and slicing not tested"
fi
echo PASS
