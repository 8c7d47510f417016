#!/bin/sh
# cycles_check.sh - no two files of libnvio (src/), of the nvio tool
# (tools/) or of the CPython extension (python/nvio/_ext/, whose one-way
# order ext.h states) depend on each other, directly or through others: the
# file-to-file graph of "calls or reads a global defined in" (from nm on
# each object) has no cycle. DESIGN.md's rule; issue 31 item 5.
#
#   sh tests/cycles_check.sh [-v] [BUILD]  (BUILD/obj holds src/'s objects)
#
# tools/ and python/nvio/_ext/ are compiled here, one object per file
# (the extension against this python3's headers; skipped with a note
# where they are missing). Prints any cycle (-v: and every edge of each
# graph); exits 1 on a cycle.

root=$(cd "$(dirname "$0")/.." && pwd)
verbose=0
if [ "$1" = -v ]; then
	verbose=1
	shift
fi
build=${1:-$root/build}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nvio-cycles.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
fail=0

# edges DIR: "from to" for each object of DIR using a symbol another defines
edges() {
	for o in "$1"/*.o; do
		b=$(basename "$o" .o)
		nm -g --defined-only "$o" | awk -v f="$b" 'NF == 3 { print $3, f }'
	done | sort >"$tmp/defs"
	for o in "$1"/*.o; do
		b=$(basename "$o" .o)
		nm -u "$o" | awk -v f="$b" '{ print $2, f }'
	done | sort >"$tmp/uses"
	join "$tmp/uses" "$tmp/defs" | awk '$2 != $3 { print $2, $3 }' | sort -u
}

# cycles: files still left after repeatedly removing those with no
# outgoing edge to a file left (what remains lies on or leads into a cycle)
check() {
	name=$1
	edges "$2" >"$tmp/edges"
	[ $verbose = 1 ] && echo "$name: $(awk '{ printf "%s%s -> %s", (NR > 1 ? "; " : ""), $1, $2 }' "$tmp/edges")"
	left=$(awk '
		{ out[$1] = out[$1] " " $2; node[$1]; node[$2] }
		END {
			do {
				changed = 0
				for (n in node) {
					k = split(out[n], t, " "); live = 0
					for (i = 1; i <= k; i++) if (t[i] in node) live = 1
					if (!live) { delete node[n]; changed = 1 }
				}
			} while (changed)
			for (n in node) printf "%s ", n
		}' "$tmp/edges")
	if [ -n "$left" ]; then
		echo "FAIL: $name: a cycle among: $left"
		fail=1
	else
		echo "ok: $name: no cycle"
	fi
}

if ! ls "$build"/obj/*.o >/dev/null 2>&1; then
	echo "cycles_check: no $build/obj/*.o (run make)"
	exit 1
fi
check src "$build/obj"
mkdir -p "$tmp/tools"
for f in "$root"/tools/*.c; do
	${CC:-cc} -std=c11 -D_GNU_SOURCE -I"$root/include" -c "$f" \
		-o "$tmp/tools/$(basename "$f" .c).o" 2>/dev/null || { echo "FAIL: cc $f"; fail=1; }
done
check tools "$tmp/tools"
pyinc=$(${PYTHON:-python3} -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
if [ -n "$pyinc" ] && [ -f "$pyinc/Python.h" ]; then
	mkdir -p "$tmp/ext"
	for f in "$root"/python/nvio/_ext/*.c; do
		${CC:-cc} -std=c11 -D_GNU_SOURCE -DPy_LIMITED_API=0x030b0000 -I"$root/include" \
			-I"$pyinc" -c "$f" -o "$tmp/ext/$(basename "$f" .c).o" 2>/dev/null ||
			{ echo "FAIL: cc $f"; fail=1; }
	done
	check python/nvio/_ext "$tmp/ext"
else
	echo "skip: python/nvio/_ext: no Python.h for ${PYTHON:-python3}"
fi
exit $fail
