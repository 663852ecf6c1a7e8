#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given budget each.
# A crasher is written under the package's testdata/fuzz and fails the run.
#
# The budget is a count of inputs ("10000x"), not a duration: with a
# duration, Go's fuzz coordinator up to go1.26 can report its own deadline as
# a failure ("context deadline exceeded", no crasher written) when a loaded
# machine's worker is mid-input as time runs out (golang/go#75804). A count
# never arms that deadline, so a red run here always means a real crasher.
set -euo pipefail
fuzztime=${1:-200000x}
case $fuzztime in
*x) ;;
*) echo "fuzz.sh: budget $fuzztime is not a count of inputs like 10000x (a duration trips golang/go#75804)" >&2; exit 2 ;;
esac
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
