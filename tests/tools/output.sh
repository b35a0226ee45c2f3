# Output: every line prefixed with its rank, stdout and stderr kept apart,
# lines whole, partial and very long lines intact.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

run_rc rc "$RUN" -n 3 "$PROBE" lines 200
expect_rc 0 "$rc" "lines"
[ "$(wc -l <"$TMP/out")" -eq 600 ] || { show; fail "stdout: $(wc -l <"$TMP/out") lines, expected 600"; }
[ "$(wc -l <"$TMP/err")" -eq 600 ] || { show; fail "stderr: $(wc -l <"$TMP/err") lines, expected 600"; }
# The prefix matches the rank inside the line; nothing from stderr on stdout.
bad=$(grep -Evc '^\[([0-2])\] out \1 [0-9]+$' "$TMP/out" || true)
[ "$bad" -eq 0 ] || { show; fail "$bad malformed stdout lines"; }
bad=$(grep -Evc '^\[([0-2])\] err \1 [0-9]+$' "$TMP/err" || true)
[ "$bad" -eq 0 ] || { show; fail "$bad malformed stderr lines"; }
for r in 0 1 2; do
    # Each rank's lines arrive complete and in order.
    grep "^\[$r\] out " "$TMP/out" | awk '{print $4}' >"$TMP/seq"
    seq 0 199 | cmp -s - "$TMP/seq" || fail "rank $r stdout lines missing or out of order"
    grep "^\[$r\] err " "$TMP/err" | awk '{print $4}' >"$TMP/seq"
    seq 0 199 | cmp -s - "$TMP/seq" || fail "rank $r stderr lines missing or out of order"
done

# A line written in two pieces comes out as one line.
run_rc rc "$RUN" -n 3 "$PROBE" partial
expect_rc 0 "$rc" "partial"
for r in 0 1 2; do
    has "$TMP/out" "^\[$r\] first half second half$" "rank $r partial line"
done
[ "$(wc -l <"$TMP/out")" -eq 3 ] || { show; fail "partial lines split"; }

# A trailing line without a newline is flushed at EOF, as it was.
run_rc rc "$RUN" -n 1 "$PROBE" echo first tail "no newline"
expect_rc 0 "$rc" "tail"
printf '[0] first\n[0] no newline' | cmp -s - "$TMP/out" || { show; fail "trailing partial line not flushed exactly"; }

# A line much longer than tern-run's buffer arrives byte for byte.
N=300000
awk -v n="$N" 'BEGIN { a = "abcdefghijklmnopqrstuvwxyz"; s = ""
    while (length(s) < n) s = s a; printf "%s", substr(s, 1, n) }' >"$TMP/expect"
run_rc rc "$RUN" -n 1 "$PROBE" long "$N"
expect_rc 0 "$rc" "long line"
[ "$(wc -l <"$TMP/out")" -eq 1 ] || fail "long line split into $(wc -l <"$TMP/out") lines with one rank"
{ printf '[0] '; cat "$TMP/expect"; echo; } | cmp -s - "$TMP/out" || fail "long line (1 rank) altered"
# With several ranks, pieces of long lines may be cut by other ranks' lines,
# but each piece carries its prefix and no byte is lost.
run_rc rc "$RUN" -n 3 "$PROBE" long "$N" echo after
expect_rc 0 "$rc" "long lines"
for r in 0 1 2; do
    grep "^\[$r\] " "$TMP/out" | grep -v "^\[$r\] after$" | sed "s/^\[$r\] //" | tr -d '\n' >"$TMP/got"
    cmp -s "$TMP/expect" "$TMP/got" || fail "rank $r long line lost bytes ($(wc -c <"$TMP/got") of $N)"
    has "$TMP/out" "^\[$r\] after$" "rank $r line after its long line"
done

# --no-prefix: the lines as the ranks wrote them.
run_rc rc "$RUN" --no-prefix -n 2 "$PROBE" echo hello
expect_rc 0 "$rc" "--no-prefix"
printf 'hello\nhello\n' | cmp -s - "$TMP/out" || { show; fail "--no-prefix output"; }

# A stdout that cannot be written: one message, and the job still runs to
# its end (the ranks' pipes keep being drained).
rc=0
"$RUN" -n 2 "$PROBE" lines 2000 echo end >/dev/full 2>"$TMP/err" || rc=$?
expect_rc 0 "$rc" "stdout on /dev/full"
[ "$(grep -c '^tern-run: cannot write to stdout: No space left on device; discarding' "$TMP/err")" -eq 1 ] ||
    { show; fail "expected one message about the unwritable stdout"; }
[ "$(grep -c '^\[[01]\] err [01] 1999$' "$TMP/err")" -eq 2 ] || { show; fail "stderr lost with stdout broken"; }

# Rank 0 reads tern-run's stdin; the others read /dev/null.
rc=0
printf 'one\ntwo\n' | "$RUN" -n 2 "$PROBE" cat >"$TMP/out" 2>"$TMP/err" || rc=$?
expect_rc 0 "$rc" "stdin"
printf '[0] one\n[0] two\n' | cmp -s - "$TMP/out" || { show; fail "stdin not given to rank 0 alone"; }
echo "PASS"
