# --help, --version, --help-env and --topology.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

run_rc rc "$RUN" --help
expect_rc 0 "$rc" "--help"
has "$TMP/out" '^usage: tern-run -n N \[options\] \[--\] program' "usage line"
for opt in --nproc --master-port --no-prefix --timeout --kill-grace --topology --help-env --markdown --version; do
    has "$TMP/out" "^ +(-n, )?$opt" "--help lists $opt"
done
run_rc rc "$RUN" -h
expect_rc 0 "$rc" "-h"

run_rc rc "$RUN" --version
expect_rc 0 "$rc" "--version"
has "$TMP/out" '^tern-run \(tern\) [0-9]+\.[0-9]+\.[0-9]+$' "--version"

run_rc rc "$RUN" --help-env
expect_rc 0 "$rc" "--help-env"
for v in TERN_LOG TERN_RANK TERN_WORLD_SIZE MASTER_ADDR MASTER_PORT SLURM_PROCID; do
    has "$TMP/out" "^$v " "--help-env lists $v"
done
run_rc rc "$RUN" --help-env --markdown
expect_rc 0 "$rc" "--help-env --markdown"
has "$TMP/out" '^\| variable \|' "markdown header"
has "$TMP/out" '^\| `TERN_LOG` \|' "markdown TERN_LOG"
has "$TMP/out" '^\| `MASTER_PORT` \|' "markdown MASTER_PORT"

run_rc rc "$RUN" --topology
expect_rc 0 "$rc" "--topology"
has "$TMP/out" '^tern [0-9.]+, optional dependencies: UCX (yes|no), verbs (yes|no), CUDA (yes|no)$' "build line"
has "$TMP/out" 'rank 0' "binding of rank 0"
lacks "$TMP/out" 'rank 1' "-n defaults to 1"
run_rc rc "$RUN" -n 3 --topology
expect_rc 0 "$rc" "-n 3 --topology"
has "$TMP/out" 'rank 2' "binding of rank 2"
# The transport in use is named, and a provider that cannot start is an
# error, never a quiet fall back.
run_rc rc env TERN_TRANSPORT=tcp "$RUN" --topology
expect_rc 0 "$rc" "--topology with TERN_TRANSPORT=tcp"
has "$TMP/out" '^  in use: tcp on [0-9.]+:[0-9]+ ' "transport line"
run_rc rc env TERN_TRANSPORT=auto "$RUN" --topology
has "$TMP/out" 'auto chose [a-z]+ on .*passed over: verbs: ' "why auto passed providers over"
run_rc rc env TERN_TRANSPORT=verbs "$RUN" --topology
expect_rc 1 "$rc" "--topology with a transport that cannot start"
has "$TMP/out" '^  none can start: transport verbs requested but cannot start: verbs: not built' "no fall back"
lacks "$TMP/out" 'in use:' "no fall back"
run_rc rc env TERN_THREADS=lots "$RUN" --topology
expect_rc 2 "$rc" "--topology with a bad TERN_THREADS"
has "$TMP/err" "^tern-run: environment variable TERN_THREADS=lots: 'lots' is not an integer$" "bad env message"
echo "PASS"
