#!/usr/bin/env bash
# tern against the fastest peers on this machine, measured in one run, so a
# ratio means something on a shared, noisy machine:
#   - a plain C TCP ping-pong (perf/tcp_pingpong.c), blocking sockets
#   - ucx_perftest (ucx-utils) tag_lat / tag_bw, UCX_TLS=tcp and UCX_TLS=sm
#   - raw UCP active messages with the ucx provider's header (perf/ucp_am_pingpong.c)
#   - Open MPI (perf/mpi_pingpong.c): TCP only (--mca btl tcp,self) and default (shared memory)
#   - collectives: Open MPI (perf/mpi_coll.c), TCP only and default (shared memory),
#     against tern's tcp provider and its ucx provider with UCX_TLS=sm: all_reduce
#     at every size of COLL_SIZES, the others (COLL_OPS) at OPS_SIZE
# Each pair is run back to back, REPEAT times (default 3), and each side's
# median is reported: on a shared VM one run can be off by 30%. Latency is
# one-way (RTT/2) average in us, bandwidth is unidirectional GB/s (10^9
# bytes). Ratios are tern / peer.
#   perf/compare.sh [BUILD_DIR]        (default: build)
#   SECTION=p2p|coll|all (default all) picks the point-to-point rows, the
#   collectives or both; the collectives also write OUT_DIR/coll_curves.csv
#   (OUT_DIR defaults to BUILD_DIR/perf), which perf/plot_coll.sh plots, and
#   keep each run's CSV in OUT_DIR/coll_runs. COLL_TRAFFIC (default 512M)
#   sets the collectives' calls per size on both sides. COLL_INPLACE=1 runs every
#   all_reduce in place on both sides (torch.distributed's form). BIND=core
#   pins the ranks on both sides alike, rank r to core r mod the cores
#   (tern-run --bind-to core; mpirun --map-by core --bind-to
#   core:overload-allowed; taskset for ucx_perftest; PEER_BIND for the forked
#   peers); the default, BIND=none, leaves both unbound.
#   Every row shows the steal (CPU time the hypervisor took) of each side's
#   runs; STEAL_MAX=N runs again, up to STEAL_TRIES times, a run that lost
#   more than N % (docs/perf.md, "Steal").
set -euo pipefail
B=$(cd "${1:-build}" && pwd)
SECTION=${SECTION:-all}
case $SECTION in p2p | coll | all) ;; *) echo "compare.sh: SECTION is p2p, coll or all, not '$SECTION'" >&2; exit 2 ;; esac
BIND=${BIND:-none}
case $BIND in none | core) ;; *) echo "compare.sh: BIND is none or core, not '$BIND'" >&2; exit 2 ;; esac
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

# BIND=core: the same placement on both sides. Unbound, 4 ranks on 2 cores
# go where the kernel puts them, which moves a run by a third
# (docs/tern-run.md, "Binding"); bound, rank r shares core r mod 2 with
# rank r+2 on both sides. The point-to-point rows bind their two processes
# to cores 0 and 1: tern-run, mpirun, the forked peers (PEER_BIND, perf/peer.h)
# and ucx_perftest's server and client (taskset).
tern_bind=() mpi_place=(--oversubscribe)
if [ "$BIND" = core ]; then
    tern_bind=(--bind-to core)
    mpi_place=(--map-by core:OVERSUBSCRIBE --bind-to core:overload-allowed)
    export PEER_BIND=1
fi
pin() { [ "$BIND" = core ] && command -v taskset >/dev/null && echo "taskset -c $1"; true; }

have_ucx_provider() { TERN_TRANSPORT=ucx "$RUN" -n 2 "$PERF" lat --sizes 8 --iters 10 >/dev/null 2>&1; }

# tern-perf over a transport; prints one number (avg lat us, or GB/s).
tern_lat() { env "${@:2}" "$RUN" -n 2 "${tern_bind[@]}" "$PERF" lat --transport "$1" --sizes 8 --iters "${ITERS:-$LAT_ITERS}" --format csv | awk -F, 'NR == 2 { print $8 }'; }
tern_bw() { env "${@:2}" "$RUN" -n 2 "${tern_bind[@]}" "$PERF" bw --transport "$1" --sizes "$BW_SIZE" --iters "$BW_ITERS" --window "$WINDOW" --format csv | awk -F, 'NR == 2 { print $10 }'; }

# ucx_perftest: server in the background, client prints "Final" numbers (-f).
ucx_run() { # TLS TEST SIZE ITERS FIELD
    local port=$((20000 + RANDOM % 20000))
    UCX_TLS=$1 timeout 120 $(pin 0) ucx_perftest -t "$2" -s "$3" -n "$4" -p "$port" -f >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    UCX_TLS=$1 timeout 120 $(pin 1) ucx_perftest 127.0.0.1 -p "$port" -t "$2" -s "$3" -n "$4" -f 2>/dev/null | awk -v f="$5" 'NF >= 8 && $1 ~ /^[0-9]+$/ { v = $f } END { print v }'
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
        timeout 120 mpirun "${root[@]}" -np 2 "${mpi_place[@]}" "${extra[@]}" "$MPI" "$mode" "$size" "$iters" $window 2>/dev/null; }

# Steal: the CPU time the hypervisor gave to someone else while this VM
# wanted it (/proc/stat), the largest error on a shared VM and invisible
# otherwise. cpu_now prints "steal total" in ticks (nothing where the kernel
# does not count steal); steal_pct the % of CPU time stolen between two.
cpu_now() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; if (NF >= 9) print $9, t; exit }' /proc/stat 2>/dev/null || true; }
steal_pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (split(a, x, " ") < 2 || split(b, y, " ") < 2 || y[2] <= x[2]) exit
    printf "%.0f\n", 100 * (y[1] - x[1]) / (y[2] - x[2]) }'; }
STEAL_WARN=5 # %, as tern-perf's TERN_BENCH_STEAL_WARN_PCT
# STEAL_MAX=N: a run whose steal passed N % is run again, up to STEAL_TRIES
# times in all (default 3); the last try counts whatever its steal. Unset:
# every run counts once.
STEAL_MAX=${STEAL_MAX:-} STEAL_TRIES=${STEAL_TRIES:-3}
case $STEAL_MAX in '' | [0-9] | [0-9][0-9] | 100) ;; *) echo "compare.sh: STEAL_MAX is a percentage, not '$STEAL_MAX'" >&2; exit 2 ;; esac
case $STEAL_TRIES in [1-9] | [1-9][0-9]) ;; *) echo "compare.sh: STEAL_TRIES is 1 to 99, not '$STEAL_TRIES'" >&2; exit 2 ;; esac
run_start=$(cpu_now) retried=0
# measure cmd...: its output in MV, its steal in MS (empty if unknown), tried
# again while the steal passes STEAL_MAX. tern-perf's own steal line (stderr,
# with CSV) is left out: the rows carry each side's.
measure() {
    local a try
    for try in $(seq "$STEAL_TRIES"); do
        a=$(cpu_now); MV=$("$@" 2> >(grep -v -e ' host steal: ' -e '^tern-run: .* bound ' -e '^# tern-perf [a-z_]*: transport ' >&2)); MS=$(steal_pct "$a" "$(cpu_now)")
        [ -n "$STEAL_MAX" ] && [ -n "$MS" ] && [ "$MS" -gt "$STEAL_MAX" ] && [ "$try" -lt "$STEAL_TRIES" ] || return 0
        retried=$((retried + 1))
    done
}
whole_steal() {
    local s
    [ -n "$STEAL_MAX" ] && echo "# STEAL_MAX=$STEAL_MAX: $retried runs were tried again (at most $STEAL_TRIES tries each)"
    s=$(steal_pct "$run_start" "$(cpu_now)")
    if [ -z "$s" ]; then
        echo "# host steal: not counted by this kernel"
    elif [ "$s" -ge "$STEAL_WARN" ]; then
        echo "# host steal over the whole comparison: $s% of the CPU time: these ratios measure the host as much as tern"
    else
        echo "# host steal over the whole comparison: $s% of the CPU time"
    fi
}

# One row: tern and its peer measured alternately REPEAT times, medians compared,
# with the median steal of each side's runs.
pair() { # metric lower_is_better peer_name tern_cmd... -- peer_cmd...
    local metric=$1 low=$2 name=$3; shift 3
    local tcmd=() pcmd=() t=() p=() ts=() ps=()
    while [ "$1" != "--" ]; do tcmd+=("$1"); shift; done; shift; pcmd=("$@")
    for _ in $(seq "$REPEAT"); do
        measure "${tcmd[@]}"; t+=("$MV"); ts+=("$MS")
        measure "${pcmd[@]}"; p+=("$MV"); ps+=("$MS")
    done
    row "$metric" "$(median "${t[@]}")" "$name" "$(median "${p[@]}")" "$low" "$(median "${ts[@]}")" "$(median "${ps[@]}")"
}
median() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "" }'; }

# Every row is also kept in rows_file (metric, peer, ratio, each side's
# steal, tab-separated) for the goals at the end.
rows_file=$(mktemp)
trap 'rm -f "$rows_file"' EXIT
row() { # metric tern peer_name peer lower_is_better [tern_steal peer_steal]
    awk -v m="$1" -v t="$2" -v n="$3" -v p="$4" -v low="$5" -v ts="${6:-}" -v ps="${7:-}" -v w="$STEAL_WARN" -v f="$rows_file" 'BEGIN {
        r = (p > 0 && t > 0) ? t / p : 0
        verdict = (r == 0) ? "n/a" : (low ? (r <= 1 ? "tern ahead" : "peer ahead") : (r >= 1 ? "tern ahead" : "peer ahead"))
        st = (ts == "" && ps == "") ? "-" : (ts == "" ? "?" : ts) "/" (ps == "" ? "?" : ps)
        if (ts + 0 >= w || ps + 0 >= w) verdict = verdict ", host steal"
        printf "%-38s %10s  %-30s %10s  %6.2f  %-7s  %s\n", m, t, n, p, r, st, verdict
        printf "%s\t%s\t%.4f\t%s\t%s\n", m, n, r, ts, ps >> f }'
}

# The speed goals of issues 3 and 4 (docs/perf.md), judged on this run's
# rows: each goal's ratio against what it needs. A goal whose rows are not
# in this run (SECTION, COLL_RANKS, a peer not installed) is left out; one
# judged on runs that lost STEAL_WARN % or more to steal says so.
goals() {
    echo "# speed goals (issues 3 and 4, docs/perf.md): tern/peer against what each needs"
    awk -F'\t' -v w="$STEAL_WARN" -v bw="$BW_SIZE" '
    function goal(name, metric, peer, op, need,   k, r, v) {
        k = metric SUBSEP peer
        if (!(k in ratio)) return
        r = ratio[k]
        if (r == 0) v = "n/a (not measured)"
        else v = (op == "<=" ? r <= need : op == "<" ? r < need : r >= need) ? "met" : "NOT MET"
        if (r != 0 && (ts[k] + 0 >= w || ps[k] + 0 >= w)) v = v ", host steal " ts[k] "/" ps[k] " %"
        printf "%-60s %6.2f  %-2s %-4s  %s\n", name, r, op, need, v
    }
    { ratio[$1 SUBSEP $2] = $3; ts[$1 SUBSEP $2] = $4; ps[$1 SUBSEP $2] = $5 }
    END {
        goal("3: tcp 8 B latency, vs a blocking C TCP ping-pong", "8 B latency, tcp provider", "plain C TCP ping-pong", "<", 1)
        goal("3: tcp 8 B latency, vs ucx_perftest tag_lat (tcp)", "8 B latency, tcp provider", "ucx_perftest tag_lat UCX_TLS=tcp", "<=", 1)
        goal("3: ucx sm 8 B latency, vs ucx_perftest tag_lat (sm)", "8 B latency, ucx provider, sm", "ucx_perftest tag_lat UCX_TLS=sm", "<=", 1.3)
        if (bw == 4194304) { # the goals name 4 MiB
            goal("3: tcp 4 MiB bandwidth, vs ucx_perftest tag_bw (tcp)", "bandwidth, tcp provider", "ucx_perftest tag_bw UCX_TLS=tcp", ">=", 1)
            goal("3: ucx sm 4 MiB bandwidth, vs ucx_perftest tag_bw (sm)", "bandwidth, ucx provider, sm", "ucx_perftest tag_bw UCX_TLS=sm", ">=", 0.9)
        }
        split("1 4 16 64", mib, " ")
        split("tcp sm", tr, " ")
        peer["tcp"] = "Open MPI, btl tcp,self"; need["tcp"] = 1.2
        peer["sm"] = "Open MPI, default (shared memory)"; need["sm"] = 1
        for (j = 1; j <= 2; j++)
            for (n = 2; n <= 4; n += 2)
                for (i = 1; i <= 4; i++)
                    goal("4: all_reduce busbw " mib[i] " MiB, " n " ranks, " tr[j] ", vs Open MPI " tr[j],
                         "allreduce busbw " mib[i] "M, " n " ranks, " tr[j], peer[tr[j]], ">=", need[tr[j]])
        goal("4: all_reduce 8 B latency, 4 ranks, tcp, vs Open MPI tcp", "allreduce lat 8 B, 4 ranks, tcp", "Open MPI, btl tcp,self", "<=", 1.2)
    }' "$rows_file"
}
head_row() { printf "%-38s %10s  %-30s %10s  %6s  %-7s  %s\n" metric tern peer peer ratio steal% verdict; }

echo "# tern vs peers on $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# each figure is the median of $REPEAT runs, tern and peer alternating; steal%: the"
echo "# median share of CPU time the hypervisor took during tern's / the peer's runs"
echo "# (/proc/stat); at ${STEAL_WARN}% or more the verdict says so: the ratio then measures the host too"

if [ "$SECTION" != coll ]; then
[ "$BIND" = core ] && echo "# both processes of every row bound to cores 0 and 1 (BIND=core)"
echo "# latency: one-way average us (lower is better); bandwidth: GB/s at $BW_SIZE bytes (higher is better)"
head_row

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
fi # SECTION p2p


if [ "$SECTION" = p2p ]; then goals; whole_steal; exit 0; fi

# ---- collectives ----
# nccl-tests' method and columns (docs/perf.md): busbw in GB/s (higher is
# better), latency = average time of one call in us, slowest rank (lower is
# better). all_reduce f32 sum: one run per transport and rank count covers
# every size of COLL_SIZES, with the iterations by size of COLL_TRAFFIC
# bytes (default 512M: 512 calls at 1 MiB, 128 at 4 MiB; 10 to 10000 calls)
# on both sides, so that each point spans a quarter second or more of this
# host's hiccups rather than a few milliseconds (the tools' own default,
# 64 MiB, is 16 calls at 4 MiB); a repeat of the whole section costs about
# a minute here. 4 ranks on 2 cores are oversubscribed, for tern and MPI
# alike.
MPIC=$B/perf/mpi-coll
COLL_SIZES=${COLL_SIZES:-8,1k,4k,16k,64k,256k,1M,4M,16M,64M}
COLL_RANKS=${COLL_RANKS:-2 4}
COLL_TRAFFIC=${COLL_TRAFFIC:-512M}
OUT_DIR=${OUT_DIR:-$B/perf}
mkdir -p "$OUT_DIR"
have_mpic=0; [ -x "$MPIC" ] && have_mpic=1
have_sm=0; have_ucx_provider && have_sm=1
# --mca pml ob1: where Open MPI's UCX pml is enabled it would take over and
# the btl list would restrict nothing.
# shellcheck disable=SC2054 # tcp,self is one argument
MPI_TCP=(--mca pml ob1 --mca btl tcp,self)
# COLL_INPLACE=1: every all_reduce in place on both sides (tern-perf and
# mpi-coll --inplace), torch.distributed's form.
ar_extra=()
[ "${COLL_INPLACE:-0}" = 1 ] && ar_extra=(--inplace)

# A collective's CSV (header and rows) on stdout; a failed run prints a
# warning and nothing else, so its values count as missing.
tern_coll() { # transport ranks test sizes [VAR=value...]
    local extra=()
    [ "$3" = allreduce ] && extra=("${ar_extra[@]}")
    env "${@:5}" timeout 300 "$RUN" -n "$2" "${tern_bind[@]}" --no-prefix "$PERF" "$3" --transport "$1" --sizes "$4" --traffic "$COLL_TRAFFIC" "${extra[@]}" --format csv ||
        echo "# tern-perf $3 over $1 with $2 ranks failed" >&2; }
mpi_coll() { # ranks test sizes [mpirun options...]
    local extra=()
    [ "$2" = allreduce ] && extra=("${ar_extra[@]}")
    timeout 300 mpirun "${root[@]}" "${mpi_place[@]}" -np "$1" "${@:4}" "$MPIC" "$2" --sizes "$3" --traffic "$COLL_TRAFFIC" "${extra[@]}" 2>/dev/null ||
        echo "# mpi-coll $2 with $1 ranks failed" >&2; }
# One column (5 size, 8 lat_us_avg, 10 algbw, 11 busbw) of the row for size in
# each file, median over the files.
coll_median() { # column size files...
    local col=$1 size=$2; shift 2
    # shellcheck disable=SC2046 # one argument per value
    median $(awk -F, -v c="$col" -v s="$size" '$5 == s && $1 != "test" { print $c }' "$@" /dev/null)
}

echo "# collectives: busbw GB/s (higher is better), latency = avg us of one call (lower is better)"
echo "# tcp: tern's tcp provider vs Open MPI --mca btl tcp,self; sm: tern's ucx provider with UCX_TLS=sm vs Open MPI's default (shared memory)"
[ ${#ar_extra[@]} -gt 0 ] && echo "# all_reduce in place on both sides (COLL_INPLACE=1)"
[ "$BIND" = core ] && echo "# ranks bound to cores on both sides (BIND=core)"
head_row
# Every run's CSV stays in OUT_DIR/coll_runs (SERIES-RANKS-REPEAT), to look
# into a median that surprises.
# Each run's steal goes to OUT_DIR/coll_steal ("SERIES-RANKS-REPEAT PCT").
cdir=$OUT_DIR/coll_runs steals=$OUT_DIR/coll_steal
rm -rf "$cdir"
mkdir -p "$cdir"
: >"$steals"
into() { # file command...: the command's output into file, its steal into $steals
    local f=$1; shift
    measure "$@"
    printf '%s\n' "$MV" >"$f"
    echo "${f##*/} $MS" >>"$steals"
}
for rep in $(seq "$REPEAT"); do
    for n in $COLL_RANKS; do
        into "$cdir/tern-tcp-$n-$rep" tern_coll tcp "$n" allreduce "$COLL_SIZES"
        [ $have_mpic = 1 ] && into "$cdir/mpi-tcp-$n-$rep" mpi_coll "$n" allreduce "$COLL_SIZES" "${MPI_TCP[@]}"
        [ $have_sm = 1 ] && into "$cdir/tern-sm-$n-$rep" tern_coll ucx "$n" allreduce "$COLL_SIZES" UCX_TLS=sm
        [ $have_mpic = 1 ] && into "$cdir/mpi-sm-$n-$rep" mpi_coll "$n" allreduce "$COLL_SIZES"
    done
done
# The median steal of one series' runs.
steal_of() { # series ranks
    # shellcheck disable=SC2046 # one argument per value
    median $(awk -v s="$1-$2-" 'index($1, s) == 1 { print $2 }' "$steals")
}
MIB=1048576
for tr in tcp sm; do
    [ $tr = sm ] && [ $have_sm = 0 ] && { echo "# the ucx provider is not built into this tern: its sm rows are skipped"; continue; }
    peer="Open MPI, btl tcp,self"; [ $tr = sm ] && peer="Open MPI, default (shared memory)"
    for n in $COLL_RANKS; do
        t=("$cdir/tern-$tr-$n-"*) p=("$cdir/mpi-$tr-$n-"*)
        [ $have_mpic = 1 ] || p=(/dev/null)
        tst=$(steal_of "tern-$tr" "$n") pst=$(steal_of "mpi-$tr" "$n")
        row "allreduce lat 8 B, $n ranks, $tr" "$(coll_median 8 8 "${t[@]}")" "$peer" "$(coll_median 8 8 "${p[@]}")" 1 "$tst" "$pst"
        for mib in 1 4 16 64; do
            sz=$((mib * MIB))
            row "allreduce busbw ${mib}M, $n ranks, $tr" "$(coll_median 11 $sz "${t[@]}")" "$peer" "$(coll_median 11 $sz "${p[@]}")" 0 "$tst" "$pst"
        done
    done
done
# The other collectives, each at OPS_SIZE on OPS_RANKS ranks over both
# transports against the same Open MPI as all_reduce: busbw (nccl-tests'
# definitions, perf/bench_coll.h, the same in mpi-coll), and the barrier's
# latency. COLL_OPS picks them (empty: none).
COLL_OPS=${COLL_OPS-broadcast reduce allgather reduce_scatter alltoall gather scatter barrier}
OPS_SIZE=${OPS_SIZE:-4M} OPS_RANKS=${OPS_RANKS:-4}
if [ $have_mpic = 1 ]; then
    op_col() { if [ "$1" = barrier ]; then echo 8; else echo 11; fi; } # lat_us_avg or busbw
    tern_op() { # tcp|sm test
        if [ "$1" = sm ]; then
            tern_coll ucx "$OPS_RANKS" "$2" "$OPS_SIZE" UCX_TLS=sm
        else
            tern_coll tcp "$OPS_RANKS" "$2" "$OPS_SIZE"
        fi | awk -F, -v c="$(op_col "$2")" 'NR == 2 { print $c }'
    }
    mpi_op() { # tcp|sm test
        if [ "$1" = sm ]; then
            mpi_coll "$OPS_RANKS" "$2" "$OPS_SIZE"
        else
            mpi_coll "$OPS_RANKS" "$2" "$OPS_SIZE" "${MPI_TCP[@]}"
        fi | awk -F, -v c="$(op_col "$2")" 'NR == 2 { print $c }'
    }
    for tr in tcp sm; do
        [ $tr = sm ] && [ $have_sm = 0 ] && continue
        peer="Open MPI, btl tcp,self"; [ $tr = sm ] && peer="Open MPI, default (shared memory)"
        for op in $COLL_OPS; do
            if [ "$op" = barrier ]; then
                pair "barrier lat, $OPS_RANKS ranks, $tr" 1 "$peer" tern_op $tr "$op" -- mpi_op $tr "$op"
            else
                pair "$op busbw $OPS_SIZE, $OPS_RANKS ranks, $tr" 0 "$peer" tern_op $tr "$op" -- mpi_op $tr "$op"
            fi
        done
    done
fi

# The curves: every series' medians at 1 KiB and up, for perf/plot_coll.sh.
curves=$OUT_DIR/coll_curves.csv
{
    echo "# allreduce f32 sum${ar_extra:+ in place}, medians of $REPEAT runs, $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "impl,transport,ranks,size,busbw_GBps,algbw_GBps,lat_us_avg"
    for series in tern-tcp mpi-tcp tern-sm mpi-sm; do
        for n in $COLL_RANKS; do
            files=("$cdir/$series-$n-"*)
            [ -e "${files[0]}" ] || continue
            for size in $(awk -F, '$1 != "test" && $5 >= 1024 { print $5 }' "${files[@]}" | sort -nu); do
                printf '%s,%s,%s,%s,%s,%s,%s\n' "${series%-*}" "${series#*-}" "$n" "$size" \
                    "$(coll_median 11 "$size" "${files[@]}")" "$(coll_median 10 "$size" "${files[@]}")" \
                    "$(coll_median 8 "$size" "${files[@]}")"
            done
        done
    done
} >"$curves"
echo "# curves: $curves (plot: perf/plot_coll.sh $curves docs/img/allreduce_busbw.png)"
goals
whole_steal
