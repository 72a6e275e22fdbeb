#!/usr/bin/env bash
# `make check-deps` (tools/check_deps.py) holds on the tree as it is and fails,
# naming the file and the rule, on each kind of deliberate violation: an
# include from a layer above, a front-end library header in a layer that may
# not use it, and (on copies of the built libraries) an object that uses a
# symbol of a layer above or needs curses where it may not.
# Prints "N passed, N failed".
set -u
BUILD=${BUILD:-build}
CC=${CC:-cc}
# Libraries built by `make sanitize` need the sanitizer runtimes to link.
nm "$BUILD/libkvbase.a" 2>/dev/null | grep -q __asan_ && CC="$CC -fsanitize=address,undefined"
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 400)"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() { python3 tools/check_deps.py "$@" 2>&1; }

out=$(check --src . --build "$BUILD" --cc "$CC"); rc=$?
[[ $rc == 0 && $out == *"includes:"* && $out == *"links:"* ]] && ok "the tree keeps the rules" || bad "the tree keeps the rules" "$out"

# Include rules on a copy of the sources: inject one line, expect a failure
# that names the file, line and rule, then restore.
mkdir -p "$tmp/src"
for d in base kernels engine profiles cli tui server; do [[ -d $d ]] && cp -r "$d" "$tmp/src/"; done
out=$(check --src "$tmp/src"); rc=$?
[[ $rc == 0 ]] && ok "the copy keeps the rules" || bad "the copy keeps the rules" "$out"
inject() { # NAME FILE LINE PATTERN-EXPECTED
  local name=$1 file=$2 line=$3 want=$4
  cp "$tmp/src/$file" "$tmp/orig"
  printf '%s\n' "$line" >>"$tmp/src/$file"
  out=$(check --src "$tmp/src"); rc=$?
  [[ $rc == 1 && $out == *"$file:"*"$want"* && $out == *"1 violation"* ]] && ok "$name" || bad "$name" "$out"
  cp "$tmp/orig" "$tmp/src/$file"
}
inject "kernels/ including engine/ fails" kernels/backend.c '#include "../engine/engine.h"' 'kernels/ includes "../engine/engine.h" from engine/'
inject "base/ including kernels/ fails" base/common.c '#include "../kernels/types.h"' 'base/ includes "../kernels/types.h" from kernels/'
inject "engine/ including profiles/ fails" engine/model.c '#include "../profiles/profile.h"' 'from profiles/'
inject "engine/ including yaml.h fails" engine/model.c '#include <yaml.h>' 'engine/ includes <yaml.h> (libyaml'
inject "engine/ including readline fails" engine/json.c '#include <readline/readline.h>' 'readline'
inject "cli/ including curses fails" cli/cmd_chat.c '#include <ncurses.h>' 'cli/ includes <ncurses.h> (curses belongs to tui/ only)'
inject "cli/ including a tui/ header fails" cli/cmd_info.c '#include "../tui/panels.h"' 'cli/ includes "../tui/panels.h" from tui/'
inject "tui/ including cli/ fails" tui/app.c '#include "../cli/bench.h"' 'tui/ includes "../cli/bench.h" from cli/'
inject "engine/ including the sim backend's header fails" engine/model.c '#include "../kernels/sim.h"' 'through the backend table'
inject "cli/ including a kernels-private header fails" cli/cmd_info.c '#include "../kernels/cpu_internal.h"' 'private to kernels/'
inject "a .c file of kernels/ including the CUDA runtime fails" kernels/cpu.c '#include <cuda_runtime.h>' 'the CUDA runtime'

# Link rules on copies of the built libraries with one extra object each.
mkdir -p "$tmp/b"
cp "$BUILD"/lib*.a "$tmp/b/"
printf 'struct kv_engine; struct kv_config; struct kv_err;\nvoid *kv_engine_new(const struct kv_config *, struct kv_err *);\nvoid *kernels_up(void) { return kv_engine_new(0, 0); }\n' >"$tmp/up.c"
$CC -c -o "$tmp/up.o" "$tmp/up.c"
cp "$BUILD/libkvkernels.a" "$tmp/keep.a"
ar rcs "$tmp/b/libkvkernels.a" "$tmp/up.o"
out=$(check --src . --build "$tmp/b" --cc "$CC"); rc=$?
[[ $rc == 1 && $out == *"kernels/ (libkvkernels.a: up.o) uses kv_engine_new, defined in engine/"* ]] \
  && ok "a kernels/ object calling the engine fails" || bad "a kernels/ object calling the engine fails" "$out"
cp "$tmp/keep.a" "$tmp/b/libkvkernels.a"
printf 'int initscr(void);\nint engine_draws(void) { return initscr(); }\n' >"$tmp/curses.c"
$CC -c -o "$tmp/curses.o" "$tmp/curses.c"
ar rcs "$tmp/b/libkvengine.a" "$tmp/curses.o"
out=$(check --src . --build "$tmp/b" --cc "$CC"); rc=$?
[[ $rc == 1 && $out == *"engine/ does not link with only -lm -lpthread"*initscr* ]] \
  && ok "an engine/ object needing curses fails" || bad "an engine/ object needing curses fails" "$out"
cp "$BUILD/libkvengine.a" "$tmp/b/"
ar rcs "$tmp/b/libkvcli.a" "$tmp/curses.o"
out=$(check --src . --build "$tmp/b" --cc "$CC"); rc=$?
[[ $rc == 1 && $out == *"cli/ does not link with only -lreadline -lyaml -lm -lpthread"*initscr* ]] \
  && ok "a cli/ object needing curses fails" || bad "a cli/ object needing curses fails" "$out"

echo "$pass passed, $fail failed"
(( fail == 0 ))
