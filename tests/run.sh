#!/bin/sh
# Runs the C tests built in BUILD_DIR/tests, one line per test, then the
# summary line "N passed, N failed, N skipped". Exit 1 if any failed.
#
#   sh tests/run.sh BUILD_DIR [NAME...]
#
# NVIO_TEST_TIMEOUT (seconds, default 600) bounds each test; a test that
# runs over it fails. A failing test's output is printed in full; of a
# passing or skipped one, only its "skip ..." / "note: ..." lines, so that
# a skipped engine is never a silent pass.

build=${1:-build}
[ $# -gt 0 ] && shift
limit=${NVIO_TEST_TIMEOUT:-600}
dir=$build/tests

if [ ! -d "$dir" ]; then
	echo "run.sh: no directory $dir" >&2
	exit 1
fi

now() {
	if [ -r /proc/uptime ]; then
		cut -d' ' -f1 /proc/uptime
	else
		date +%s
	fi
}

pass=0
fail=0
skip=0
out=$(mktemp "${TMPDIR:-/tmp}/nvio-run.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT INT TERM

for t in "$dir"/*; do
	[ -f "$t" ] && [ -x "$t" ] || continue
	name=${t##*/}
	if [ $# -gt 0 ]; then
		want=0
		for n in "$@"; do
			[ "$n" = "$name" ] && want=1
		done
		[ $want = 1 ] || continue
	fi
	start=$(now)
	if command -v timeout >/dev/null 2>&1; then
		timeout "$limit" "$t" >"$out" 2>&1
	else
		"$t" >"$out" 2>&1
	fi
	rc=$?
	secs=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
	case $rc in
	0)
		echo "PASS $name (${secs}s)"
		grep -E '^(skip|SKIP|note:)' "$out" | sed 's/^/    /'
		pass=$((pass + 1))
		;;
	77)
		echo "SKIP $name"
		grep -E '^(skip|SKIP|note:)' "$out" | sed 's/^/    /'
		skip=$((skip + 1))
		;;
	*)
		if [ $rc = 124 ]; then
			echo "FAIL $name (timed out after ${limit}s)"
		else
			echo "FAIL $name (exit $rc, ${secs}s)"
		fi
		sed 's/^/    /' "$out"
		fail=$((fail + 1))
		;;
	esac
done

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
