#!/usr/bin/env bash
# Checks that every C++ and CUDA file of the repository (tracked, or new and not ignored) is laid
# out as .clang-format says (CTest `format`): lists each file clang-format would change and exits 1.
# To fix them: bash scripts/check-format.sh --fix
# Debian's clang-format (scripts/test.sh installs it); its version is printed, since another
# version may lay out a few lines differently. Exit 77 (skipped) without it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
format=$(command -v clang-format || true)
if [ -z "$format" ]; then
  echo "skip: clang-format is not installed (Debian: clang-format)"
  exit 77
fi
echo "format: $("$format" --version)"
# Tracked files and new ones not yet added (not those .gitignore leaves out).
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = --fix ]; then
  "$format" -i "${files[@]}"
  echo "format: laid out ${#files[@]} files"
  exit 0
fi
changed=()
for file in "${files[@]}"; do
  if ! "$format" --dry-run --Werror "$file" > /dev/null 2>&1; then changed+=("$file"); fi
done
if [ "${#changed[@]}" -gt 0 ]; then
  echo "format: ${#changed[@]} of ${#files[@]} files are not laid out as .clang-format says (bash scripts/check-format.sh --fix):"
  printf '  %s\n' "${changed[@]}"
  exit 1
fi
echo "format: all ${#files[@]} files as .clang-format says"
