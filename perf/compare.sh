#!/usr/bin/env bash
# tern against the fastest peers on this machine, measured in one run, so a
# ratio means something on a shared, noisy machine:
#   - a plain C TCP ping-pong (perf/tcp_pingpong.c), blocking sockets
#   - ucx_perftest (ucx-utils) tag_lat / tag_bw, UCX_TLS=tcp and UCX_TLS=sm
#   - raw UCP active messages with the ucx provider's header (perf/ucp_am_pingpong.c)
#   - Open MPI (perf/mpi_pingpong.c): TCP only (--mca btl tcp,self) and default (shared memory)
# Each pair is run back to back, REPEAT times (default 3), and each side's
# median is reported: on a shared VM one run can be off by 30%. Latency is
# one-way (RTT/2) average in us, bandwidth is unidirectional GB/s (10^9
# bytes). Ratios are tern / peer.
#   perf/compare.sh [BUILD_DIR]        (default: build)
set -euo pipefail
B=$(cd "${1:-build}" && pwd)
RUN=$B/tools/tern-run PERF=$B/perf/tern-perf TCP=$B/perf/tcp-pingpong MPI=$B/perf/mpi-pingpong
AM=$B/perf/ucp-am-pingpong
# Shared memory is 10x faster than loopback TCP: SM_LAT_ITERS keeps its runs
# long enough (about 0.2 s) to average over the VM's hiccups.
LAT_ITERS=${LAT_ITERS:-20000} SM_LAT_ITERS=${SM_LAT_ITERS:-200000} BW_SIZE=${BW_SIZE:-4194304} BW_ITERS=${BW_ITERS:-100} WINDOW=${WINDOW:-16}
REPEAT=${REPEAT:-3}
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
export TERN_LOG=error
# One machine: UCX (tern's ucx provider and ucx_perftest) stays on loopback.
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}

have_ucx_provider() { TERN_TRANSPORT=ucx "$RUN" -n 2 "$PERF" lat --sizes 8 --iters 10 >/dev/null 2>&1; }

# tern-perf over a transport; prints one number (avg lat us, or GB/s).
tern_lat() { env "${@:2}" "$RUN" -n 2 "$PERF" lat --transport "$1" --sizes 8 --iters "${ITERS:-$LAT_ITERS}" --format csv | awk -F, 'NR == 2 { print $8 }'; }
tern_bw() { env "${@:2}" "$RUN" -n 2 "$PERF" bw --transport "$1" --sizes "$BW_SIZE" --iters "$BW_ITERS" --window "$WINDOW" --format csv | awk -F, 'NR == 2 { print $10 }'; }

# ucx_perftest: server in the background, client prints "Final" numbers (-f).
ucx_run() { # TLS TEST SIZE ITERS FIELD
    local port=$((20000 + RANDOM % 20000))
    UCX_TLS=$1 timeout 120 ucx_perftest -t "$2" -s "$3" -n "$4" -p "$port" -f >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    UCX_TLS=$1 timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$2" -s "$3" -n "$4" -f 2>/dev/null | awk -v f="$5" 'NF >= 8 && $1 ~ /^[0-9]+$/ { v = $f } END { print v }'
    wait "$srv" 2>/dev/null || true
}
ucx_lat() { ucx_run "$1" tag_lat 8 "${ITERS:-$LAT_ITERS}" 3; }
# ucx_perftest reports MB/s with MB = 2^20 bytes.
ucx_bw() { ucx_run "$1" tag_bw "$BW_SIZE" "$BW_ITERS" 5 | awk '{ printf "%.3f\n", $1 * 1048576 / 1e9 }'; }

mpi_lat() { mpi lat 8 "${ITERS:-$LAT_ITERS}" "$@" | awk -F, '{ print $3 }'; }
mpi_bw() { mpi bw "$BW_SIZE" "$BW_ITERS" "$@" "$WINDOW" | awk -F, '{ print $3 }'; }
# mpirun takes its options before the program; the window goes after it.
mpi() { local mode=$1 size=$2 iters=$3; shift 3; local extra=() window=""
        while [ $# -gt 0 ]; do case $1 in --mca) extra+=("$1" "$2" "$3"); shift 3 ;; *) window=$1; shift ;; esac; done
        timeout 120 mpirun "${root[@]}" -np 2 "${extra[@]}" "$MPI" "$mode" "$size" "$iters" $window 2>/dev/null; }

# One row: tern and its peer measured alternately REPEAT times, medians compared.
pair() { # metric lower_is_better peer_name tern_cmd... -- peer_cmd...
    local metric=$1 low=$2 name=$3; shift 3
    local tcmd=() pcmd=() t=() p=()
    while [ "$1" != "--" ]; do tcmd+=("$1"); shift; done; shift; pcmd=("$@")
    for _ in $(seq "$REPEAT"); do t+=("$("${tcmd[@]}")"); p+=("$("${pcmd[@]}")"); done
    row "$metric" "$(median "${t[@]}")" "$name" "$(median "${p[@]}")" "$low"
}
median() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "" }'; }

row() { # metric tern peer_name peer lower_is_better
    awk -v m="$1" -v t="$2" -v n="$3" -v p="$4" -v low="$5" 'BEGIN {
        r = (p > 0 && t > 0) ? t / p : 0
        verdict = (r == 0) ? "n/a" : (low ? (r <= 1 ? "tern ahead" : "peer ahead") : (r >= 1 ? "tern ahead" : "peer ahead"))
        printf "%-34s %10s  %-30s %10s  %6.2f  %s\n", m, t, n, p, r, verdict }'
}

echo "# tern vs peers on $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# latency: one-way average us (lower is better); bandwidth: GB/s at $BW_SIZE bytes (higher is better)"
echo "# each figure is the median of $REPEAT runs, tern and peer alternating"
printf "%-34s %10s  %-30s %10s  %6s  %s\n" metric tern peer peer ratio verdict

tcp_lat() { "$TCP" lat 8 "$LAT_ITERS" | awk -F, '{ print $3 }'; }
tcp_bw() { "$TCP" bw "$BW_SIZE" "$BW_ITERS" "$WINDOW" | awk -F, '{ print $3 }'; }
pair "8 B latency, tcp provider" 1 "plain C TCP ping-pong" tern_lat tcp -- tcp_lat
pair "8 B latency, tcp provider" 1 "ucx_perftest tag_lat UCX_TLS=tcp" tern_lat tcp -- ucx_lat tcp
pair "bandwidth, tcp provider" 0 "plain C TCP stream" tern_bw tcp -- tcp_bw
pair "bandwidth, tcp provider" 0 "ucx_perftest tag_bw UCX_TLS=tcp" tern_bw tcp -- ucx_bw tcp
if [ -x "$MPI" ]; then
    pair "8 B latency, tcp provider" 1 "Open MPI, btl tcp,self" tern_lat tcp -- mpi_lat --mca btl tcp,self
    pair "bandwidth, tcp provider" 0 "Open MPI, btl tcp,self" tern_bw tcp -- mpi_bw --mca btl tcp,self
fi
if have_ucx_provider; then
    ITERS=$SM_LAT_ITERS pair "8 B latency, ucx provider, sm" 1 "ucx_perftest tag_lat UCX_TLS=sm" tern_lat ucx UCX_TLS=sm -- ucx_lat sm
    # The floor under the provider: UCP AMs with its header and nothing else.
    am_lat() { UCX_TLS=sm timeout 120 "$AM" 8 "${ITERS:-$LAT_ITERS}" | awk -F, '{ print $3 }'; }
    [ -x "$AM" ] && ITERS=$SM_LAT_ITERS pair "8 B latency, ucx provider, sm" 1 "raw UCP AM, same header, sm" tern_lat ucx UCX_TLS=sm -- am_lat
    pair "bandwidth, ucx provider, sm" 0 "ucx_perftest tag_bw UCX_TLS=sm" tern_bw ucx UCX_TLS=sm -- ucx_bw sm
    [ -x "$MPI" ] && ITERS=$SM_LAT_ITERS pair "8 B latency, ucx provider, sm" 1 "Open MPI, default (shared memory)" tern_lat ucx UCX_TLS=sm -- mpi_lat
else
    echo "# the ucx provider is not built into this tern: its rows are skipped"
fi
