#!/usr/bin/env bash
# Runs every Go fuzz target in the repository for a short time (default 10s each). The seed corpora in
# testdata/fuzz run as plain tests in `go test` too; this adds fresh inputs.
set -euo pipefail
fuzztime=${1:-10s}
status=0
found=0
while IFS= read -r line; do
	found=$((found + 1))
	file=${line%%:*}
	name=$(sed -E 's/^.*func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' <<<"$line")
	pkg=./$(dirname "$file")
	echo "fuzz $pkg $name ($fuzztime)"
	go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg" || status=1
done < <(git grep --untracked -n -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' -- '*_test.go' | sed -E 's/^([^:]*):[0-9]+:/\1:/')
# A fuzz step that found nothing to run must not pass.
if [ "$found" -eq 0 ]; then echo "fuzz: no Fuzz targets found" >&2; exit 1; fi
exit $status
