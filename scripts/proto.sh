#!/usr/bin/env bash
# Regenerates the Go code for the protocol definitions kept in this repository.
#
# Every tool is pinned, and the script refuses to run with any other version so
# that the committed generated files change only when a pin changes:
#   protoc               PROTOC_VERSION (Debian bookworm: apt-get install protobuf-compiler)
#   protoc-gen-go        PROTOC_GEN_GO_VERSION (matches google.golang.org/protobuf in go.mod)
#   protoc-gen-go-grpc   PROTOC_GEN_GO_GRPC_VERSION (generated code needs grpc >= 1.64)
# The Go plugins are built with `go install` into ./.tools/bin, nothing global.
#
# Usage: scripts/proto.sh          regenerate
#        scripts/proto.sh -check   regenerate into a temporary tree and fail if
#                                  the committed files differ
set -euo pipefail

PROTOC_VERSION=3.21.12
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/.tools/bin"
protoc=${PROTOC:-protoc}

# Each entry: the .proto file relative to the repository root. Its Go code is
# written next to it.
protos=(
	caclient/linkerd/identitypb/identity.proto
	brokerapi/brokerpb/brokerapi.proto
)

# Go packages of the files that are unmodified copies of another project's
# and so name none (go_package): given to protoc-gen-go and protoc-gen-go-grpc
# with their M option, so the copy need not be edited.
declare -A gopkg=(
	[brokerapi/brokerpb/brokerapi.proto]=github.com/meshagent/meshagent/brokerapi/brokerpb
)

die() { echo "proto.sh: $*" >&2; exit 1; }

# install_plugin NAME PACKAGE VERSION WANT: builds NAME at VERSION unless the
# copy in .tools/bin already reports WANT.
install_plugin() {
	local name=$1 pkg=$2 version=$3 want=$4
	if [[ -x "$tools/$name" ]] && [[ "$("$tools/$name" --version 2>/dev/null)" == "$want" ]]; then
		return
	fi
	echo "proto.sh: installing $name $version into .tools/bin" >&2
	mkdir -p "$tools"
	# Keep the tool directory out of git without touching the repository's .gitignore.
	[[ -f "$root/.tools/.gitignore" ]] || echo '*' >"$root/.tools/.gitignore"
	GOBIN="$tools" GOFLAGS=-mod=mod go install "$pkg@$version"
	local got
	got=$("$tools/$name" --version 2>/dev/null) || die "$name does not run"
	[[ "$got" == "$want" ]] || die "$name reports '$got', want '$want'"
}

command -v "$protoc" >/dev/null || die "protoc not found; install protoc $PROTOC_VERSION (Debian: apt-get install protobuf-compiler) or set PROTOC"
got=$("$protoc" --version)
[[ "$got" == "libprotoc $PROTOC_VERSION" ]] || die "protoc reports '$got', want 'libprotoc $PROTOC_VERSION'"

install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
	"$PROTOC_GEN_GO_VERSION" "protoc-gen-go $PROTOC_GEN_GO_VERSION"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
	"$PROTOC_GEN_GO_GRPC_VERSION" "protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}"

out="$root"
if [[ "${1:-}" == "-check" ]]; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
elif [[ $# -gt 0 ]]; then
	die "unknown argument $1 (accepted: -check)"
fi

cd "$root"
for p in "${protos[@]}"; do
	mkdir -p "$out/$(dirname "$p")"
	mopt=()
	if [[ -n "${gopkg[$p]:-}" ]]; then
		mopt=(--go_opt="M$p=${gopkg[$p]}" --go-grpc_opt="M$p=${gopkg[$p]}")
	fi
	PATH="$tools:$PATH" "$protoc" -I . \
		--plugin=protoc-gen-go="$tools/protoc-gen-go" \
		--plugin=protoc-gen-go-grpc="$tools/protoc-gen-go-grpc" \
		--go_out="$out" --go_opt=paths=source_relative \
		--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
		"${mopt[@]}" \
		"$p"
done

if [[ "$out" != "$root" ]]; then
	status=0
	for p in "${protos[@]}"; do
		for f in "${p%.proto}.pb.go" "${p%.proto}_grpc.pb.go"; do
			if ! diff -u "$root/$f" "$out/$f"; then
				echo "proto.sh: $f is out of date; run scripts/proto.sh" >&2
				status=1
			fi
		done
	done
	exit $status
fi
echo "proto.sh: generated ${#protos[@]} file(s)" >&2
