#!/bin/sh
# run_fuzz.sh FUZZER SEED_DIR WORK_DIR SECONDS [DICT]
# Runs a libFuzzer binary for a bounded time. New inputs go to WORK_DIR (in the
# build tree), never into the committed seeds; crashes land in WORK_DIR too.
set -eu
fuzzer=$1 seeds=$2 work=$3 secs=$4
dict=${5:-}
mkdir -p "$work/corpus"
set -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/"
if [ -n "$dict" ]; then
    set -- "$@" -dict="$dict"
fi
exec "$fuzzer" "$@" "$work/corpus" "$seeds"
