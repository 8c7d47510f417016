#!/bin/sh
# Runs every test nvio has and ends with one line counting them:
#   C tests built with gcc and with clang (-Werror), plain, under
#   ASan+UBSan and under TSan; the man page check; packaging (make install,
#   pkg-config, exported symbols, sdist -> wheel -> venv); the Python tests.
# Installs its own prerequisites first (scripts/deps.sh).
#
# The C stages after the gcc one run one after another in the background
# from the start (packaging once the gcc stage's build/ is made), while the
# gcc stage and then the Python tests run, NVIO_TEST_JOBS tests at a time
# (C: default 2, tests/run.sh; Python: default 3, pytest-xdist; 1: one at
# a time; both mostly wait on I/O, child processes and timeouts, so more
# tests than cores keep the cores busy). The tests marked "serial" (they
# time something: tests/py/conftest.py's SERIAL) run last, alone, once the
# background stages are done. Each stage's output is shown whole, in the
# order above, whatever order they finished in.
# NVIO_TEST_FAST=1 runs only the plain gcc build and the Python tests.
set -u
cd "$(dirname "$0")/.." || exit 1
sh scripts/deps.sh || exit 1
PY=${PYTHON:-python3}
log=$(mktemp -d)
chain=
trap '[ -n "$chain" ] && kill "$chain" 2>/dev/null; rm -rf "$log"' EXIT
passed=0 failed=0 skipped=0

# Adds the counts of a log's last "N passed, N failed[, N skipped]" line.
count() {
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
	if [ -z "$line" ]; then failed=$((failed + 1)); return; fi
	p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
	f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
	s=$(echo "$line" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p')
	passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
}

# report NAME RC: shows a finished stage's output, counts its tests.
report() {
	echo "=== $1"
	cat "$log/$1"
	count "$log/$1"
	if [ "$2" != 0 ] && ! grep -qE '^[0-9]+ passed, [1-9][0-9]* failed' "$log/$1"; then
		echo "=== $1 exited $2"
		grep -qE '^[0-9]+ passed, [0-9]+ failed' "$log/$1" && failed=$((failed + 1))
	fi
}

# stage NAME COMMAND...: runs a stage, shows its output, counts its tests.
stage() {
	name=$1; shift
	"$@" >"$log/$name" 2>&1
	report "$name" $?
}

# quiet NAME COMMAND...: runs a stage for report later: its output in
# $log/NAME, its exit status in $log/NAME.rc.
quiet() {
	name=$1; shift
	"$@" >"$log/$name" 2>&1
	echo $? >"$log/$name.rc"
}

# The GPU tests run against the simulated CUDA driver and cuFile
# (tests/sim/); a missing simulator fails them instead of skipping.
export NVIO_TEST_REQUIRE_SIM=1

# The rest of the C stages, in the background from the start, in their
# own build folders (build-clang, build-asan, build-tsan); packaging, whose
# make uses build/, once the gcc stage is done with it.
later=
c_rest() {
	quiet c-clang make -j2 CC=clang BUILD=build-clang WERROR=1 check
	quiet c-asan env NVIO_TEST_QUICK=1 make -j2 CC=clang SAN=address WERROR=1 check
	quiet c-tsan env NVIO_TEST_QUICK=1 make -j2 CC=clang SAN=thread WERROR=1 check
	quiet man sh tests/man_check.sh
	while [ ! -f "$log/c-gcc.done" ]; do sleep 1; done
	quiet packaging env CC=gcc WERROR=1 sh tests/packaging_check.sh
}
if [ "${NVIO_TEST_FAST:-0}" != 1 ]; then
	later="c-clang c-asan c-tsan man packaging"
	c_rest &
	chain=$!
fi

stage c-gcc make -j2 CC=gcc WERROR=1 check
: >"$log/c-gcc.done"

# Teeth: test_cuda must fail when libnvio leaves out the stream
# synchronisation after its staged copies (NVIO_TEST_BREAK_SYNC=1).
gpu_teeth() {
	if NVIO_TEST_BREAK_SYNC=1 timeout 300 build/tests/test_cuda >"$log/teeth.out" 2>&1; then
		cat "$log/teeth.out"
		echo "test_cuda passed with a stream synchronisation left out: the simulator missed it"
		echo "0 passed, 1 failed"
		return 1
	fi
	grep -E 'differs|FAIL' "$log/teeth.out" | head -n 3
	echo "1 passed, 0 failed"
}
stage gpu-teeth gpu_teeth

# pytest's own summary is "N passed, M skipped in Ts"; restate it in ours,
# both runs' counts added.
pytest_stage() {
	$PY -m pip install -q . || { echo "0 passed, 1 failed"; return 1; }
	jobs=${NVIO_TEST_JOBS:-3}
	par=
	[ "$jobs" -gt 1 ] 2>/dev/null && $PY -c "import xdist" 2>/dev/null && par="-n $jobs"
	out=$(mktemp)
	tp=0 tf=0 ts=0
	tally() {	# pytest's summary: its last line that counts tests and says how long
		last=$(grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected).* in [0-9.]+s' "$out" |
			tail -n 1)
		num() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' | head -n 1; }
		p=$(num passed); f=$(num failed); e=$(num error); s=$(num skipped)
		[ -n "$last" ] || f=1		# no summary: it did not finish
		tp=$((tp + ${p:-0})); tf=$((tf + ${f:-0} + ${e:-0})); ts=$((ts + ${s:-0}))
	}
	echo "--- tests/py, ${par:-one at a time} (not marked serial)"
	(cd tests/py && $PY -m pytest -q -p no:cacheprovider $par -m "not serial" . 2>&1) | tee "$out"
	tally
	if [ -n "$chain" ]; then wait "$chain"; chain=; fi
	echo "--- tests/py, marked serial, alone"
	# only the files that have such tests: collecting all costs ~20 s
	files=$(cd tests/py && $PY -c "import conftest, os
print(' '.join(sorted({s.split('::')[0] for s in conftest.SERIAL} & set(os.listdir('.')))))" \
		2>/dev/null) || files=.
	(cd tests/py && $PY -m pytest -q -p no:cacheprovider -p no:xdist -m serial ${files:-.} 2>&1) | tee "$out"
	tally
	rm -f "$out"
	echo "$tp passed, $tf failed, $ts skipped"
}
quiet python pytest_stage
[ -n "$chain" ] && wait "$chain"
for name in $later python; do
	rc=1
	[ -f "$log/$name.rc" ] && rc=$(cat "$log/$name.rc")
	report "$name" "$rc"
done

# What failed, again at the end, where a log cut to its head and tail
# still shows it.
if [ "$failed" != 0 ]; then
	echo "=== failures"
	for f in "$log"/*; do
		case $(basename "$f") in
		teeth.out|*.rc|*.done) continue ;;	# fails on purpose; exit statuses
		gpu-teeth) pat='^[0-9]+ passed, [1-9][0-9]* failed' ;;
		*) pat='^(FAIL|FAILED|ERROR)|^[0-9]+ passed, [1-9][0-9]* failed' ;;
		esac
		grep -E "$pat" "$f" | head -n 20 | sed "s|^|$(basename "$f"): |"
	done
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
