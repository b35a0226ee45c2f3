#!/usr/bin/env bash
# Plot the all_reduce curves compare.sh writes (OUT_DIR/coll_curves.csv): bus
# bandwidth against size on a log axis, one line per implementation,
# transport and rank count (tern solid, Open MPI dashed in the same colour), titled with the
# machine and date the CSV's first line records. Needs gnuplot (gnuplot-nox,
# which ci/install-deps.sh installs).
#   perf/plot_coll.sh [CSV] [PNG]
#   defaults: build/perf/coll_curves.csv and docs/img/allreduce_busbw.png
set -euo pipefail
csv=${1:-build/perf/coll_curves.csv}
png=${2:-docs/img/allreduce_busbw.png}
header=impl,transport,ranks,size,busbw_GBps,algbw_GBps,lat_us_avg
die() { echo "plot_coll.sh: $*" >&2; exit 1; }

command -v gnuplot >/dev/null || die "gnuplot not found (apt-get install gnuplot-nox, or ci/install-deps.sh)"
[ -r "$csv" ] || die "cannot read $csv (perf/compare.sh writes it)"
[ "$(grep -v '^#' "$csv" | head -n1)" = "$header" ] || die "$csv: the header is not $header"
what=$(sed -n '1s/^# *//p' "$csv")
[ -n "$what" ] || what="(no description line in $csv)"
what=${what//\"/\'} # it goes inside a gnuplot string
mkdir -p "$(dirname "$png")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One data block per series, in the CSV's order (gnuplot's "index" picks a
# block), and one plot clause per block.
awk -F, -v data="$tmp/data" -v clauses="$tmp/clauses" '
    /^#/ || $1 == "impl" { next }
    NF != 7 || $4 !~ /^[0-9]+$/ || $5 !~ /^[0-9.]+$/ { next }    # a failed run leaves a cell empty
    {
        key = $1 " " $2 " " $3
        if (!(key in idx)) {
            idx[key] = n++
            order[idx[key]] = key
            name = ($1 == "mpi" ? "Open MPI" : $1) " " ($2 == "sm" && $1 == "tern" ? "ucx sm" : $2) ", " $3 " ranks"
            title[idx[key]] = name
            dash[idx[key]] = $1 == "mpi" ? 2 : 1
            pt[idx[key]] = $1 == "mpi" ? 6 : 7
            # One colour per transport and rank count: tern and MPI side by side.
            if (!(($2 " " $3) in color))
                color[$2 " " $3] = ++ncolors
            lc[idx[key]] = color[$2 " " $3]
        }
        rows[idx[key]] = rows[idx[key]] $4 " " $5 "\n"
    }
    END {
        for (i = 0; i < n; i++) {
            printf "%s\n\n", rows[i] > data
            printf "%s\"%s\" index %d using 1:2 with linespoints linecolor %d dashtype %d linewidth 2 pointtype %d title \"%s\"", \
                (i ? ", \\\n    " : ""), data, i, lc[i], dash[i], pt[i], title[i] > clauses
        }
        if (n == 0)
            exit 1
    }' "$csv" || die "$csv has no data rows"

# Size labels at the measured sizes (1K, 4K, ..., 64M), and a margin on both
# sides so that the end labels are drawn.
sizes=$(grep -v '^#' "$csv" | awk -F, 'NR > 1 && $4 ~ /^[0-9]+$/ { print $4 }' | sort -nu)
tics=$(awk '{ v = $1; l = v >= 1048576 ? v / 1048576 "M" : v >= 1024 ? v / 1024 "K" : v "B"
              printf "%s\"%s\" %s", (NR > 1 ? ", " : ""), l, v }' <<<"$sizes")
xrange=$(awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "[%g:%g]", (lo > 0 ? lo : 1) / 1.4, hi * 1.4 }' <<<"$sizes")

cat >"$tmp/plot.gp" <<EOF
set terminal pngcairo size 1100,650 noenhanced font ",11"
set output "$png"
set title "bus bandwidth: $what"
set logscale x 2
set xrange $xrange
set xtics ($tics)
set xlabel "size (bytes)"
set ylabel "busbw (GB/s, 10^9 bytes)"
set yrange [0:*]
set grid
set key left top
plot $(cat "$tmp/clauses")
EOF
gnuplot "$tmp/plot.gp" || die "gnuplot failed on $tmp/plot.gp"
echo "plot_coll.sh: wrote $png"
