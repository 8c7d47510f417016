#!/bin/sh
# man_check.sh - every public function has a man page, and every page renders cleanly.
#
#   sh tests/man_check.sh [REPO_ROOT]
#
# For each function declared NVIO_API in include/nvio.h, man/man3/<function>.3 must
# exist; it may be a one-line ".so man3/other.3" link to a family page, whose target
# must exist and whose NAME section must list the function. Every page under man/
# (man3, man7 and nvio.1 when present) must render with no warning from groff and
# from man(1). Exits 0 when everything passed, 1 otherwise; prints "N passed, N failed".

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
header=$root/include/nvio.h
mandir=$root/man
pass=0
fail=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

if [ ! -f "$header" ]; then
	echo "man_check: no $header" >&2
	exit 1
fi
if ! command -v groff >/dev/null 2>&1 && ! command -v man >/dev/null 2>&1; then
	echo "man_check: neither groff nor man is installed (apt-get install groff man-db)" >&2
	exit 1
fi

# The page a link points to, or the page itself.
resolve() {
	target=$(sed -n '1s/^\.so[ 	]*//p' "$1")
	if [ -n "$target" ]; then
		echo "$mandir/$target"
	else
		echo "$1"
	fi
}

# Names listed in the NAME section of a page (the words before "\-").
page_names() {
	sed -n '/^\.SH NAME/,/^\.SH/p' "$1" | sed -e '1d' -e '$d' -e 's/\\-.*//' |
		tr ', ' '\n\n' | sed '/^$/d'
}

# Rendering: no output on stderr from either formatter. .so paths are relative
# to man/, as man(1) resolves them, so run from there.
render() {
	rel=${1#"$mandir"/}
	out=$( (cd "$mandir" &&
		if command -v groff >/dev/null 2>&1; then
			groff -s -man -ww -z -Tutf8 "$rel" 2>&1 >/dev/null
		fi
		if command -v man >/dev/null 2>&1; then
			MANWIDTH=80 MAN_KEEP_FORMATTING= man --warnings -l -Tutf8 "$rel" \
				2>&1 >/dev/null
		fi) )
	if [ -n "$out" ]; then
		bad "$rel renders with warnings:"
		echo "$out" | sed 's/^/    /'
	else
		ok
	fi
}

funcs=$(sed -n 's/.*NVIO_API[^(]*[ *]\(nvio_[a-z0-9_]*\)[ 	]*(.*/\1/p' "$header" | sort -u)
if [ -z "$funcs" ]; then
	bad "no NVIO_API functions found in $header"
fi

for f in $funcs; do
	page=$mandir/man3/$f.3
	if [ ! -f "$page" ]; then
		bad "$f: no man/man3/$f.3"
		continue
	fi
	main=$(resolve "$page")
	if [ ! -f "$main" ]; then
		bad "$f: man3/$f.3 links to missing ${main#"$mandir"/}"
		continue
	fi
	if page_names "$main" | grep -qx "$f"; then
		ok
	else
		bad "$f: not listed in the NAME section of ${main#"$mandir"/}"
	fi
done

if [ -f "$mandir/man7/nvio.7" ]; then
	ok
else
	bad "no man/man7/nvio.7"
fi

for page in "$mandir"/man3/*.3 "$mandir"/man7/*.7 "$mandir"/*.1 "$mandir"/man1/*.1; do
	[ -f "$page" ] || continue
	render "$page"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
