#!/usr/bin/env bash
# Regenerate docs/env.md and the README's environment table from the table in
# core/config.c (through tern-run --help-env --markdown).
#   docs/gen-env.sh [BUILD_DIR]      (default: build)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
run=${1:-$top/build}/tools/tern-run
table=$("$run" --help-env --markdown)
printf '%s\n' "$table" >"$top/docs/env.md"
# Replace what stands between the README's markers.
awk -v table="$table" '
    /<!-- env:begin -->/ { print; print table; skip = 1; next }
    /<!-- env:end -->/ { skip = 0 }
    !skip { print }
' "$top/README.md" >"$top/README.md.new"
mv "$top/README.md.new" "$top/README.md"
