# --bind-to core: rank r runs on core r mod the cores tern-run may use. The
# test works out the cores from what the ranks get (a core with hyperthreads
# is several PUs), so it holds on any machine: every rank's PUs lie within
# tern-run's, ranks C apart share a core and no others do, the cores cover
# tern-run's PUs, and a tern-run confined to one PU binds every rank there.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# The PUs of a list like "0-2,5" one per line.
expand() {
    local part
    for part in ${1//,/ }; do
        if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
    done
}
allowed() { # the Cpus_allowed_list of each rank in $TMP/out, by rank
    sed -nE 's/^\[([0-9]+)\] Cpus_allowed_list:[[:space:]]*(.*)$/\1 \2/p' "$TMP/out" | sort -n
}
mine=$(sed -nE 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
npus=$(expand "$mine" | wc -l)
n=$((2 * npus + 1))

run_rc rc "$RUN" -n "$n" --bind-to core sh -c 'exec grep Cpus_allowed_list /proc/self/status'
expect_rc 0 "$rc" "--bind-to core"
[ "$(allowed | wc -l)" -eq "$n" ] || { show; fail "expected $n ranks' affinity"; }
has "$TMP/err" "^tern-run: $n ranks bound round-robin to [0-9]+ cores?, PUs " "the binding summary"
declare -A set_of
while read -r r list; do set_of[$r]=$list; done < <(allowed)
# C: the first rank that shares rank 0's set.
cores=0
for ((r = 1; r < n; r++)); do
    if [ "${set_of[$r]}" = "${set_of[0]}" ]; then cores=$r; break; fi
done
[ "$cores" -ge 1 ] || { show; fail "no rank shares rank 0's core among $n ranks on $npus PUs"; }
has "$TMP/err" "bound round-robin to $cores cores?, PUs " "the summary's core count"
union=""
for ((r = 0; r < n; r++)); do
    [ "${set_of[$r]}" = "${set_of[$((r % cores))]}" ] ||
        { show; fail "rank $r on ${set_of[$r]}, rank $((r % cores)) on ${set_of[$((r % cores))]}"; }
    for pu in $(expand "${set_of[$r]}"); do
        expand "$mine" | grep -qx "$pu" || fail "rank $r runs on PU $pu, outside tern-run's $mine"
    done
done
for ((a = 0; a < cores; a++)); do
    for ((b = a + 1; b < cores; b++)); do
        common=$(comm -12 <(expand "${set_of[$a]}" | sort) <(expand "${set_of[$b]}" | sort))
        [ -z "$common" ] || fail "ranks $a and $b share PUs $common but are on different cores"
    done
    union+=$(expand "${set_of[$a]}")$'\n'
done
[ "$(echo -n "$union" | sort -n | uniq | tr '\n' ' ')" = "$(expand "$mine" | sort -n | tr '\n' ' ')" ] ||
    fail "the cores cover $(echo -n "$union" | tr '\n' ' '), tern-run may use $mine"

# Without it, and with none, the ranks keep tern-run's affinity.
for opt in "" "--bind-to=none"; do
    run_rc rc "$RUN" -n 2 $opt sh -c 'exec grep Cpus_allowed_list /proc/self/status'
    expect_rc 0 "$rc" "unbound '$opt'"
    [ "$(allowed | awk -v m="$mine" '$2 == m' | wc -l)" -eq 2 ] || { show; fail "'$opt': ranks not on $mine"; }
    lacks "$TMP/err" "bound round-robin" "'$opt': no binding summary"
done

# Confined by taskset, tern-run binds within what it was given.
first=$(expand "$mine" | head -1)
run_rc rc taskset -c "$first" "$RUN" -n 3 --bind-to core sh -c 'exec grep Cpus_allowed_list /proc/self/status'
expect_rc 0 "$rc" "taskset -c $first"
[ "$(allowed | awk -v m="$first" '$2 == m' | wc -l)" -eq 3 ] || { show; fail "ranks not on PU $first"; }
has "$TMP/err" "^tern-run: 3 ranks bound round-robin to 1 core, PUs $first \(more ranks than cores: they share\)$" "confined summary"

run_rc rc "$RUN" -n 2 --bind-to socket true
expect_rc 2 "$rc" "--bind-to socket"
has "$TMP/err" "^tern-run: --bind-to: 'socket' is not one of none, core$" "bad --bind-to"
echo "PASS"
