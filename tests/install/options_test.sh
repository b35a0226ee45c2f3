#!/usr/bin/env bash
# The TERN_WITH_* options: AUTO uses a dependency when found and goes on
# without it when not, ON fails the configure with a clear message when it is
# missing, OFF never looks, anything else is an error. "Missing" is made by a
# pkg-config search path that holds only hwloc (required) and cmocka.
#   options_test.sh SOURCE_DIR
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/pc"
for m in hwloc cmocka; do
    f=$(pkg-config --variable=pcfiledir "$m")/$m.pc
    cp "$f" "$tmp/pc/"
done

configure() { # name, then cmake -D options; prints the log, returns cmake's status
    local name=$1; shift
    PKG_CONFIG_LIBDIR="$tmp/pc" PKG_CONFIG_PATH="" \
        cmake -S "$src" -B "$tmp/b-$name" -DBUILD_TESTING=OFF -DTERN_WITH_CUDA=OFF "$@" >"$tmp/$name.log" 2>&1
}
fail() { echo "FAIL: $*"; exit 1; }

for dep in UCX VERBS; do
    if configure "on-$dep" "-DTERN_WITH_$dep=ON"; then
        fail "TERN_WITH_$dep=ON configured although $dep is missing"
    fi
    grep -q "TERN_WITH_$dep=ON but pkg-config could not find" "$tmp/on-$dep.log" \
        || { cat "$tmp/on-$dep.log"; fail "no clear message for a missing $dep"; }
    configure "auto-$dep" "-DTERN_WITH_$dep=AUTO" || { cat "$tmp/auto-$dep.log"; fail "AUTO without $dep failed"; }
    grep -q "tern: $dep OFF (TERN_WITH_$dep=AUTO)" "$tmp/auto-$dep.log" || fail "AUTO did not report $dep OFF"
    configure "off-$dep" "-DTERN_WITH_$dep=OFF" || fail "OFF failed"
    grep -q "^#define TERN_HAVE_$dep 0" "$tmp/b-off-$dep/include/tern/build_config.h" || fail "OFF still has $dep"
done
if configure bad -DTERN_WITH_UCX=MAYBE; then fail "TERN_WITH_UCX=MAYBE was accepted"; fi
grep -q "TERN_WITH_UCX='MAYBE': must be AUTO, ON or OFF" "$tmp/bad.log" || fail "no clear message for a bad value"

# With the real search path, AUTO finds what this machine has installed.
if pkg-config --exists ucx; then
    cmake -S "$src" -B "$tmp/b-real" -DBUILD_TESTING=OFF -DTERN_WITH_CUDA=OFF -DTERN_WITH_UCX=ON >"$tmp/real.log" 2>&1 \
        || { cat "$tmp/real.log"; fail "TERN_WITH_UCX=ON failed although ucx is installed"; }
    grep -q "^#define TERN_HAVE_UCX 1" "$tmp/b-real/include/tern/build_config.h" || fail "UCX found but not enabled"
fi
echo "PASS: TERN_WITH_* options behave"
