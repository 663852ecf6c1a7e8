#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given time each.
# A crasher is written under the package's testdata/fuzz and fails the run.
set -euo pipefail
fuzztime=${1:-5s}
cd "$(dirname "$0")/../.."
found=0
while IFS=: read -r file _ line; do
	name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' <<<"$line")
	pkg=./$(dirname "$file")
	found=1
	echo "fuzz $pkg $name for $fuzztime"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"
done < <(git grep -n -E '^func Fuzz[A-Za-z0-9_]*\(' -- '*_test.go' 2>/dev/null || true)
[ "$found" = 1 ] || echo "no fuzz targets"
