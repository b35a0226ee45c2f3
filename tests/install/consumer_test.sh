#!/usr/bin/env bash
# Install the build tree into a temporary prefix, then build and run a separate
# project against it twice: through find_package(tern) and through pkg-config.
#   consumer_test.sh BUILD_DIR SOURCE_DIR [SANITIZE]
set -euo pipefail
build=$1 src=$2 sanitize=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

flags=""
[ -n "$sanitize" ] && flags="-fsanitize=$sanitize"

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
for f in include/tern/tern.h include/tern/build_config.h lib/pkgconfig/tern.pc bin/tern-run; do
    [ -e "$tmp/prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$tmp/prefix"/lib*/cmake/tern/ternConfig.cmake >/dev/null || { echo "FAIL: no ternConfig.cmake"; exit 1; }

cmake -S "$src/ci/consumer" -B "$tmp/cbuild" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$tmp/cfg.log" 2>&1 \
    || { cat "$tmp/cfg.log"; echo "FAIL: consumer configure"; exit 1; }
cmake --build "$tmp/cbuild" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; echo "FAIL: consumer build"; exit 1; }
libdir=$(dirname "$(ls "$tmp/prefix"/lib*/libtern.so)")
out=$(env -u TERN_RANK -u TERN_WORLD_SIZE LD_LIBRARY_PATH="$libdir" "$tmp/cbuild/consumer")
echo "$out"
[[ $out == "consumer: tern "*", rank 0 of 1, "*" pool threads" ]] || { echo "FAIL: unexpected output"; exit 1; }

# pkg-config route
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
cc $flags -Werror -o "$tmp/consumer-pc" "$src/ci/consumer/main.c" $(pkg-config --cflags --libs tern)
out=$(LD_LIBRARY_PATH="$libdir" "$tmp/consumer-pc")
[[ $out == "consumer: tern "* ]] || { echo "FAIL: pkg-config build gave: $out"; exit 1; }
echo "PASS: find_package(tern) and pkg-config tern both build and run"
