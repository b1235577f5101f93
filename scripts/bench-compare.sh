#!/usr/bin/env bash
# bench-compare.sh BASE: meshbench's figures of the working tree against
# those of the git ref BASE, measured side by side.
#
# BASE is checked out in a temporary git worktree and built with its own
# `make build`; the working tree is built with `make build` too. One
# meshbench (the working tree's) then measures both binaries in alternating
# rounds (BASE first in odd rounds, the working tree first in even ones), so
# that a machine whose speed drifts moves both alike. It prints, for each
# figure, the median over the rounds of each side's median, the ratio of
# those medians, and the median of the per-round ratios (paired). The
# package initialisers' allocations (GODEBUG=inittrace=1) are added as
# init_alloc_kb and init_allocs.
#
# Environment: ROUNDS (default 3), ONLY (meshbench groups, default
# cold,steady,xds,rotation,workloadapi), BENCH_FLAGS (more meshbench flags),
# KEEP=1 keeps the temporary directory (each round's output).
# Not for CI: time figures move by ±30 % on a shared machine; judge them by
# several runs. See docs/performance.md.
set -euo pipefail

base=${1:-${BASE:-}}
if [[ -z "$base" ]]; then
	echo "usage: $0 BASE (a git ref), or make bench-compare BASE=<ref>" >&2
	exit 2
fi
rounds=${ROUNDS:-3}
only=${ONLY:-cold,steady,xds,rotation,workloadapi}
root=$(git rev-parse --show-toplevel)
rev=$(git -C "$root" rev-parse --verify "$base^{commit}")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-compare.XXXXXX")
cleanup() {
	git -C "$root" worktree remove --force "$tmp/src" >/dev/null 2>&1 || true
	if [[ "${KEEP:-}" == 1 ]]; then
		echo "kept $tmp" >&2
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT

echo "building $base ($rev) in $tmp/src" >&2
git -C "$root" worktree add --detach "$tmp/src" "$rev" >/dev/null
make -s -C "$tmp/src" build >&2
cp "$tmp/src/bin/meshagent" "$tmp/base.bin"
echo "building the working tree" >&2
make -s -C "$root" build >&2
cp "$root/bin/meshagent" "$tmp/head.bin"
(cd "$root" && go build -o "$tmp/meshbench" ./cmd/meshbench)

# initallocs BIN SIDE: the package initialisers' allocations, as BENCH lines.
initallocs() {
	GODEBUG=inittrace=1 "$1" version 2>&1 >/dev/null |
		awk -v side="$2" '/^init / {b += $8; a += $10}
			END {printf "%s init_alloc_kb %.1f KB\n%s init_allocs %d allocs\n", side, b / 1024, side, a}'
}

results="$tmp/results"
: >"$results"
for r in $(seq 1 "$rounds"); do
	order="base head"
	if ((r % 2 == 0)); then order="head base"; fi
	for side in $order; do
		echo "round $r of $rounds: $side" >&2
		initallocs "$tmp/$side.bin" "$side $r" >>"$results"
		# shellcheck disable=SC2086 # BENCH_FLAGS is a list of flags
		if ! (cd "$root" && "$tmp/meshbench" -agent "$tmp/$side.bin" -only "$only" ${BENCH_FLAGS:-} \
			>"$tmp/$side.$r.out" 2>"$tmp/$side.$r.err"); then
			echo "meshbench reported failures for $side in round $r (see below)" >&2
		fi
		grep '^BENCH .* FAIL' "$tmp/$side.$r.out" >&2 || true
		awk -v side="$side $r" '/^BENCH / && $3 != "FAIL" {print side, $2, $3, $4}' "$tmp/$side.$r.out" >>"$results"
	done
done

echo
echo "BASE $base ($rev) vs the working tree, $rounds rounds"
awk '
function median(list,   n, v, i, j, t) {
	n = split(list, v, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
	if (n == 0) return ""
	return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
{
	side = $1; round = $2; name = $3
	if (!(name in unit)) { order[++n] = name; unit[name] = $5 }
	val[side, name] = val[side, name] " " $4
	at[side, round, name] = $4
	rounds[round] = 1
}
END {
	printf "%-46s %12s %12s %8s %8s\n", "figure", "base", "head", "ratio", "paired"
	for (i = 1; i <= n; i++) {
		name = order[i]
		b = median(val["base", name]); h = median(val["head", name])
		ratios = ""
		for (r in rounds) if ((("base", r, name) in at) && (("head", r, name) in at) && at["base", r, name] + 0 != 0)
			ratios = ratios " " at["head", r, name] / at["base", r, name]
		ratio = (b != "" && b + 0 != 0 && h != "") ? sprintf("%.3f", h / b) : "-"
		paired = ratios != "" ? sprintf("%.3f", median(ratios)) : "-"
		printf "%-46s %12s %12s %8s %8s  %s\n", name, (b == "" ? "-" : sprintf("%.6g", b)), (h == "" ? "-" : sprintf("%.6g", h)), ratio, paired, unit[name]
	}
}' "$results"
