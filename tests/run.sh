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
#
# NVIO_TEST_JOBS (default 2) tests run at a time (each in a directory of
# its own; most of their time is spent waiting on I/O, timeouts and
# threads, not on a CPU); the lines come in the tests' order all the same,
# each test's as soon as it and every test before it has finished.

build=${1:-build}
[ $# -gt 0 ] && shift
limit=${NVIO_TEST_TIMEOUT:-600}
jobs=${NVIO_TEST_JOBS:-2}
dir=$build/tests

if [ ! -d "$dir" ]; then
	echo "run.sh: no directory $dir" >&2
	exit 1
fi
case $jobs in ''|*[!0-9]*|0) jobs=1 ;; esac

res=$(mktemp -d "${TMPDIR:-/tmp}/nvio-run.XXXXXX") || exit 1
trap 'rm -rf "$res"' EXIT
trap 'exit 130' INT TERM

# The tests to run, in order.
list=
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
	list="$list $t"
done

# One test: its output in $res/NAME.out, then "RC SECS" in $res/NAME.rc
# (written last: its presence says the test is done).
one='
now() {
	if [ -r /proc/uptime ]; then
		cut -d" " -f1 /proc/uptime
	else
		date +%s
	fi
}
t=$1 res=$2 limit=$3
name=${t##*/}
start=$(now)
if command -v timeout >/dev/null 2>&1; then
	timeout "$limit" "$t" >"$res/$name.out" 2>&1
else
	"$t" >"$res/$name.out" 2>&1
fi
rc=$?
secs=$(awk -v a="$start" -v b="$(now)" "BEGIN { printf \"%.1f\", b - a }")
echo "$rc $secs" >"$res/$name.rc.tmp" && mv "$res/$name.rc.tmp" "$res/$name.rc"
'
if [ -n "$list" ]; then
	printf '%s\n' $list | xargs -P "$jobs" -I{} sh -c "$one" sh {} "$res" "$limit" &
	runner=$!
fi

pass=0
fail=0
skip=0
for t in $list; do
	name=${t##*/}
	while [ ! -f "$res/$name.rc" ]; do
		kill -0 "$runner" 2>/dev/null || break
		sleep 0.1
	done
	out=$res/$name.out
	rc=none secs=?
	[ -f "$res/$name.rc" ] && read -r rc secs <"$res/$name.rc"
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
		if [ "$rc" = 124 ]; then
			echo "FAIL $name (timed out after ${limit}s)"
		elif [ "$rc" = none ]; then
			echo "FAIL $name (no result: its runner was stopped)"
		else
			echo "FAIL $name (exit $rc, ${secs}s)"
		fi
		[ -f "$out" ] && sed 's/^/    /' "$out"
		fail=$((fail + 1))
		;;
	esac
done
[ -n "$list" ] && wait "$runner"

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
