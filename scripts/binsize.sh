#!/usr/bin/env bash
# binsize.sh: what a Go binary's code and read-only data are made of, per package.
#
#   bash scripts/binsize.sh BIN              # the largest packages of BIN
#   bash scripts/binsize.sh BASE_BIN BIN     # the packages that grew or shrank most from BASE_BIN to BIN
#
# Sizes are summed from `go tool nm -size` over text (T/t) and read-only data (R/r)
# symbols; writable data and BSS (D/d/B/b) are left out, as they are not the binary's
# file-backed pages. A symbol belongs to the package its name starts with ("type:" and
# the like stripped, generic arguments ignored); the compiler's shared tables (go:func.*,
# go:string.*, itabs, runtime.pclntab and friends) are listed under their own names.
# Environment: TOP (rows printed, default 40), GROUP=module to sum by module path
# (github.com/owner/repo, k8s.io/name, golang.org/x/name, ...) instead of by package.
set -euo pipefail

top=${TOP:-40}
group=${GROUP:-package}

usage() { echo "usage: $0 [BASE_BIN] BIN" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
for f in "$@"; do [ -f "$f" ] || { echo "$0: $f: no such file" >&2; exit 2; }; done

# sizes BIN: lines "<bytes> <package>", one per package, largest first.
sizes() {
	go tool nm -size "$1" | awk -v group="$group" '
		$3 !~ /^[TtRr]$/ { next }
		{
			name = $4
			for (i = 5; i <= NF; i++) name = name " " $i   # names with spaces (rare)
			if (name ~ /^go:(func|string|cuinfo|info|itab|buildinfo)/ || name ~ /^runtime\.(pclntab|findfunctab|functab|filetab|pctab|cutab|etext|text|rodata|erodata|types|etypes|noptrdata|enoptrdata|gcdata|gcbss)$/) {
				split(name, parts, "."); pkg = "(" parts[1] (parts[2] != "" ? "." parts[2] : "") ")"
				if (name ~ /^go:itab/) pkg = "(itabs)"
				sum[pkg] += $2; next
			}
			sub(/^(type:|go:|gclocals·|\*)+/, "", name)
			sub(/^\*/, "", name)
			b = index(name, "["); if (b > 0) name = substr(name, 1, b - 1)
			# the package path ends at the first "." after the last "/"
			slash = 0
			for (i = length(name); i > 0; i--) if (substr(name, i, 1) == "/") { slash = i; break }
			rest = substr(name, slash + 1)
			d = index(rest, ".")
			pkg = d > 0 ? substr(name, 1, slash + d - 1) : name
			if (group == "module") {
				n = split(pkg, q, "/")
				if (q[1] ~ /^(github\.com|gitlab\.com|go\.opentelemetry\.io|cel\.dev)$/ && n >= 3) pkg = q[1] "/" q[2] "/" q[3]
				else if (q[1] ~ /^(golang\.org|google\.golang\.org|k8s\.io|sigs\.k8s\.io|go\.uber\.org|gopkg\.in|go\.yaml\.in|istio\.io|go\.etcd\.io)$/ && n >= 2) pkg = q[1] "/" q[2]
				else if (q[1] !~ /\./) pkg = "std:" q[1]
			}
			sum[pkg] += $2
		}
		END { for (k in sum) printf "%d %s\n", sum[k], k }' | sort -k1,1nr
}

if [ $# -eq 1 ]; then
	sizes "$1" > "${TMPDIR:-/tmp}/binsize.$$"
	trap 'rm -f "${TMPDIR:-/tmp}/binsize.$$"' EXIT
	awk -v top="$top" '
		{ total += $1; row[NR] = $0 }
		END {
			printf "%10s  %s\n", "KB", "package (text + read-only data)"
			for (i = 1; i <= NR && i <= top; i++) { split(row[i], f, " "); printf "%10.1f  %s\n", f[1] / 1024, substr(row[i], length(f[1]) + 2) }
			printf "%10.1f  total (%d packages)\n", total / 1024, NR
		}' "${TMPDIR:-/tmp}/binsize.$$"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sizes "$1" > "$tmp/base"
sizes "$2" > "$tmp/head"
awk -v top="$top" '
	FNR == NR { base[$2] = $1; next }
	{ head[$2] = $1 }
	END {
		for (p in base) if (!(p in head)) head[p] = 0
		for (p in head) { d = head[p] - base[p]; tb += base[p]; th += head[p]; printf "%d %d %d %s\n", (d < 0 ? -d : d), base[p], head[p], p }
		printf "TOTAL %d %d\n", tb, th > "/dev/stderr"
	}' "$tmp/base" "$tmp/head" 2> "$tmp/total" | sort -k1,1nr | head -n "$top" > "$tmp/rows"
printf "%10s %10s %10s  %s\n" "base KB" "KB" "change KB" "package (text + read-only data), largest changes first"
awk '{ printf "%10.1f %10.1f %+10.1f  %s\n", $2 / 1024, $3 / 1024, ($3 - $2) / 1024, $4 }' "$tmp/rows"
awk '{ printf "%10.1f %10.1f %+10.1f  total\n", $2 / 1024, $3 / 1024, ($3 - $2) / 1024 }' "$tmp/total"
