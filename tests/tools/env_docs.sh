# docs/env.md and the README's environment table are the output of
# tern-run --help-env --markdown, kept current (docs/gen-env.sh writes both).
# Usage: bash env_docs.sh TERN_RUN DOCS_ENV_MD README_MD
set -euo pipefail
RUN=${1:?usage: $0 TERN_RUN DOCS_ENV_MD README_MD}
DOC=${2:?usage: $0 TERN_RUN DOCS_ENV_MD README_MD}
README=${3:?usage: $0 TERN_RUN DOCS_ENV_MD README_MD}
fix="regenerate with docs/gen-env.sh BUILD_DIR"
[ -f "$DOC" ] || { echo "FAIL: $DOC is missing; $fix" >&2; exit 1; }
want=$("$RUN" --help-env --markdown)
if ! diff -u "$DOC" <(printf '%s\n' "$want") >&2; then
    echo "FAIL: $DOC differs from 'tern-run --help-env --markdown' (diff above); $fix" >&2
    exit 1
fi
got=$(awk '/<!-- env:end -->/ { p = 0 } p { print } /<!-- env:begin -->/ { p = 1 }' "$README")
if ! diff -u <(printf '%s\n' "$got") <(printf '%s\n' "$want") >&2; then
    echo "FAIL: the README's environment table is stale (diff above); $fix" >&2
    exit 1
fi
echo "PASS"
