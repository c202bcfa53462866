#!/usr/bin/env bash
# fsdp.cpp used as a user would: installed to a temporary prefix, the examples built as a project
# of their own with find_package(fsdp), and custom_model run at N = 2 against the same model in one
# process (every step's loss within 1e-5, as the parity tests; a resumed run bit for bit), and
# custom_loop run at N = 2 (its loss falls).
# Usage: consumer_test.sh BUILD_DIR MPIRUN SOURCE_DIR
set -euo pipefail
build=$1 mpirun=$2 source=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "consumer_test: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log" 2>&1 || { cat "$work/install.log"; fail "install failed"; }
[ -f "$work/prefix/lib/cmake/fsdp/fsdpConfig.cmake" ] || fail "no fsdpConfig.cmake under the prefix"
# The installed programs find libtorch (the torch wheel is no system library: their RUNPATH).
"$work/prefix/bin/fsdp-plan" --model gpt2 --ranks 2 --compact > "$work/plan.txt" 2>&1 \
  || { cat "$work/plan.txt"; fail "the installed fsdp-plan does not run"; }
# pkg-config, for a build without CMake: a program using the zoo, compiled and linked from its flags.
cat > "$work/pc.cpp" <<'CPP'
#include <cstdio>
#include "fsdp/models/registry.h"
int main() { std::printf("%lld\n", static_cast<long long>(fsdp::models::parameter_count(fsdp::models::model_config("gpt2")))); }
CPP
pc_flags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs fsdp) || fail "pkg-config does not know fsdp"
# shellcheck disable=SC2086  # the flags are a list
g++ -O1 "$work/pc.cpp" -o "$work/pc" $pc_flags > "$work/pc.log" 2>&1 || { cat "$work/pc.log"; fail "building with pkg-config's flags failed"; }
[ "$("$work/pc")" = 124439808 ] || fail "the pkg-config-built program printed '$("$work/pc")', not GPT-2's 124439808 parameters"
echo "pkg-config: a program built from \`pkg-config --cflags --libs fsdp\` runs"
cmake -S "$source/examples" -B "$work/examples" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configuring the examples against the installed package failed"; }
cmake --build "$work/examples" -j2 > "$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; fail "building the examples failed"; }

run2=("$mpirun" --oversubscribe --bind-to none -np 2)
"${run2[@]}" "$work/examples/custom_model" --checkpoints "$work/checkpoints" > "$work/sharded.txt" 2>&1 \
  || { cat "$work/sharded.txt"; fail "custom_model at N = 2 failed"; }
"$work/examples/custom_model" --single-process > "$work/single.txt" 2>&1 || { cat "$work/single.txt"; fail "custom_model --single-process failed"; }
python3 - "$work/sharded.txt" "$work/single.txt" <<'PY'
import re, sys
def losses(path):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+) loss (\S+)$", open(path).read(), re.M)}
sharded, single = losses(sys.argv[1]), losses(sys.argv[2])
if len(single) != 12 or sharded.keys() != single.keys():
    sys.exit(f"consumer_test: expected 12 steps from both runs, got {sorted(sharded)} and {sorted(single)}")
worst = max(abs(sharded[s] - single[s]) for s in single)
print(f"custom_model N=2 against one process: 12 steps, largest loss difference {worst:.2e} (tolerance 1e-5)")
if worst > 1e-5:
    sys.exit("consumer_test: the sharded losses differ from the single-process ones")
if not single[11] < single[0]:
    sys.exit("consumer_test: the loss did not fall")
PY
grep -q "^resume: identical$" "$work/sharded.txt" || { cat "$work/sharded.txt"; fail "the resumed run did not repeat the losses"; }

"${run2[@]}" "$work/examples/custom_loop" > "$work/loop.txt" 2>&1 || { cat "$work/loop.txt"; fail "custom_loop at N = 2 failed"; }
first=$(awk '/^step  0 loss/ {print $4}' "$work/loop.txt")
last=$(awk '/^step 19 loss/ {print $4}' "$work/loop.txt")
python3 -c "import sys; sys.exit(0 if float('$last') < float('$first') else 1)" \
  || { cat "$work/loop.txt"; fail "custom_loop's loss did not fall ($first -> $last)"; }
echo "custom_loop N=2: loss $first -> $last"
echo "consumer_test: passed"
