#!/usr/bin/env bash
# Counts `.unwrap()` / `.expect(` in shipped code (library and binary
# sources; not tests, examples, benches, or `#[cfg(test)]` modules, which by
# this workspace's convention sit at the end of a file, or in files named
# tests.rs or NAME_tests.rs) and fails when the
# count grows past the recorded baseline in .ci/unwrap-baseline. Lower the
# baseline when you remove some: `.ci/unwrap-count.sh --update`.
set -euo pipefail
cd "$(dirname "$0")/.."
count_file() {
  awk '
    /^[[:space:]]*#\[cfg\(test\)\]/ { exit }
    /^[[:space:]]*\/\// { next }
    { n += gsub(/\.unwrap\(\)/, "&") + gsub(/\.expect\(/, "&") }
    END { print n + 0 }
  ' "$1"
}
total=0
report=""
while IFS= read -r f; do
  n=$(count_file "$f")
  if [ "$n" -gt 0 ]; then
    total=$((total + n))
    report+="$n $f"$'\n'
  fi
done < <(git ls-files -- '*.rs' | grep -E '(^|/)src/' | grep -vE '(^|/)(tests|examples|benches)/|(^|/)([a-z0-9_]+_)?tests\.rs$')
baseline_file=.ci/unwrap-baseline
if [ "${1:-}" = "--update" ]; then
  echo "$total" > "$baseline_file"
  echo "unwrap/expect outside tests: $total (baseline updated)"
  exit 0
fi
baseline=$(cat "$baseline_file" 2>/dev/null || echo 0)
echo "unwrap/expect outside tests: $total (baseline $baseline)"
if [ "$total" -gt "$baseline" ]; then
  echo "the count grew by $((total - baseline)); return errors instead (or, where a panic is truly impossible, say why in an expect message and update the baseline with .ci/unwrap-count.sh --update). Per file:" >&2
  printf '%s' "$report" | sort -rn >&2
  exit 1
fi
