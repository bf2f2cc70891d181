#!/usr/bin/env bash
# Checks or applies the repository's .clang-format on every C/C++ source of the tree.
#   tools/scripts/format.sh --check   name the files that differ (with a diff of the first few);
#                                     fail if any does (CI)
#   tools/scripts/format.sh --fix     rewrite them in place
# Environment: CLANG_FORMAT (default clang-format-14: one version, so every machine agrees).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mode=${1:---check}
clang_format=${CLANG_FORMAT:-clang-format-14}
command -v "$clang_format" >/dev/null ||
  { echo "format.sh: $clang_format not found: apt-get install clang-format-14" >&2; exit 1; }

cd "$root"
# Tracked sources when this is a git checkout (build trees are never tracked), else a walk.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f \
    \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) \
    -print | sed 's|^\./||' | sort)
fi
[ ${#files[@]} -gt 0 ] || { echo "format.sh: no source found under $root" >&2; exit 1; }

case "$mode" in
  --fix)
    printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P "$(nproc)" "$clang_format" -i --style=file
    echo "format.sh: ${#files[@]} files formatted"
    ;;
  --check)
    mapfile -t differ < <(printf '%s\0' "${files[@]}" | xargs -0 -n 1 -P "$(nproc)" sh -c \
      '"$0" --dry-run --Werror --style=file "$1" >/dev/null 2>&1 || echo "$1"' "$clang_format" | sort)
    if [ ${#differ[@]} -eq 0 ]; then
      echo "format.sh: ${#files[@]} files match .clang-format"
      exit 0
    fi
    for f in "${differ[@]:0:3}"; do
      "$clang_format" --style=file "$f" | diff -u --label "$f" --label "$f (formatted)" "$f" - | head -40 || true
    done
    printf '  %s\n' "${differ[@]}"
    echo "format.sh: ${#differ[@]} of ${#files[@]} files differ from .clang-format: run tools/scripts/format.sh --fix" >&2
    exit 1
    ;;
  *)
    echo "usage: tools/scripts/format.sh --check|--fix" >&2
    exit 2
    ;;
esac
