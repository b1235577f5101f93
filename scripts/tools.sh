#!/usr/bin/env bash
# Builds the programs the tests run besides the agent: etcd and kube-apiserver (the
# tests' own Kubernetes API server, test/kubeenv), helm (renders and lints the chart),
# spiffe-helper (a Workload API client nobody here wrote), and Istio's pilot-discovery
# (istiod) and pilot-agent with the CRDs and injection templates of the same module
# (test/istiod, docs/istio.md). `scripts/tools.sh -node`
# also builds kubelet, kube-controller-manager, kube-scheduler and kubectl for the
# end-to-end tests' single-node cluster (test/e2e, `make e2e`). Each is built from its Go
# module at the version pinned in test/tools (kube-apiserver and etcd, which must agree),
# test/tools/helm, test/tools/spiffe-helper and test/tools/istio, never from anything else.
#
# Binaries go to $MESHAGENT_TOOLS_DIR, by default
# $HOME/.cache/meshagent/tools/<key>, where <key> is a hash of those modules' go.mod and
# go.sum files: a changed pin means a new directory, and a tool already built there is
# not built again. test/kubeenv (ToolPath) computes the same directory.
#
# Usage: scripts/tools.sh          build what is missing
#        scripts/tools.sh -node    the same, and the node's programs
#        scripts/tools.sh -dir     print the directory and exit
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The files whose content names the pinned versions, in the order test/kubeenv hashes them.
key_files=(
	test/tools/go.mod
	test/tools/go.sum
	test/tools/helm/go.mod
	test/tools/helm/go.sum
	test/tools/spiffe-helper/go.mod
	test/tools/spiffe-helper/go.sum
	test/tools/istio/go.mod
	test/tools/istio/go.sum
)

die() { echo "tools.sh: $*" >&2; exit 1; }

key() { cat "${key_files[@]}" | sha256sum | cut -c1-16; }

dir=${MESHAGENT_TOOLS_DIR:-"${HOME:?HOME is not set}/.cache/meshagent/tools/$(key)"}
# A relative MESHAGENT_TOOLS_DIR is relative to the repository root, for the tests too.
case $dir in /*) ;; *) dir="$root/$dir" ;; esac

node=false
case "${1:-}" in
-dir)
	echo "$dir"
	exit 0
	;;
-node)
	node=true
	shift
	;;
esac
[ $# -eq 0 ] || die "unknown argument $1 (usage: scripts/tools.sh [-node|-dir])"

mkdir -p "$dir"
# One build at a time per directory: parallel `make test` runs wait instead of racing.
exec 9>"$dir/.lock"
flock 9

export GOWORK=off
export GOFLAGS=-mod=readonly

# build NAME MODULE_DIR PACKAGE [go build flags...]: builds PACKAGE in MODULE_DIR into
# $dir/NAME unless it is there. The binary is written under a temporary name and
# renamed, so an interrupted build never leaves a truncated tool behind.
build() {
	local name=$1 moddir=$2 pkg=$3
	shift 3
	if [ -x "$dir/$name" ]; then
		return 0
	fi
	local start=$SECONDS
	echo "tools: building $name ($pkg) into $dir"
	(cd "$moddir" && go build "$@" -o "$dir/.$name.tmp" "$pkg") ||
		die "building $name failed"
	mv -f "$dir/.$name.tmp" "$dir/$name"
	echo "tools: built $name in $((SECONDS - start))s"
}

# Versions the programs report, set at link time as their own release builds do.
kube_version=$(cd test/tools && go list -m -f '{{.Version}}' k8s.io/kubernetes)
helm_version=$(cd test/tools/helm && go list -m -f '{{.Version}}' helm.sh/helm/v3)

build etcd test/tools go.etcd.io/etcd/server/v3
build kube-apiserver test/tools ./kube-apiserver \
	-ldflags "-X k8s.io/component-base/version.gitVersion=$kube_version"
build helm test/tools/helm helm.sh/helm/v3/cmd/helm \
	-ldflags "-X helm.sh/helm/v3/internal/version.version=$helm_version"
build spiffe-helper test/tools/spiffe-helper github.com/spiffe/spiffe-helper/cmd/spiffe-helper

# istiod and pilot-agent from one pinned istio.io/istio module, and from the same module the
# CRDs (applied by test/istiod) and the istio-discovery chart (rendered by the tests for the
# injector's ConfigMap, with Istio's own injection templates).
# go list -m names the module's directory only once it is downloaded: on a fresh machine,
# download it first.
(cd test/tools/istio && go mod download istio.io/istio)
istio_dir=$(cd test/tools/istio && go list -m -f '{{.Dir}}' istio.io/istio)
[ -n "$istio_dir" ] && [ -f "$istio_dir/VERSION" ] || die "istio.io/istio not found in the module cache"
# The version they report is the one Istio's own development builds set: the module's
# VERSION file plus "-dev" (istiod parses proxies' versions; a pseudo-version is not one).
# Static, as Istio's release builds are: pilot-agent runs in the e2e cluster's istio-proxy
# image, which has no C library.
istio_ldflags="-X istio.io/istio/pkg/version.buildVersion=$(cat "$istio_dir/VERSION")-dev"
CGO_ENABLED=0 build pilot-discovery test/tools/istio istio.io/istio/pilot/cmd/pilot-discovery -ldflags "$istio_ldflags"
CGO_ENABLED=0 build pilot-agent test/tools/istio istio.io/istio/pilot/cmd/pilot-agent -ldflags "$istio_ldflags"
if [ ! -d "$dir/istio-manifests" ]; then
	rm -rf "$dir/.istio-manifests.tmp"
	mkdir -p "$dir/.istio-manifests.tmp"
	cp "$istio_dir/manifests/charts/base/files/crd-all.gen.yaml" "$dir/.istio-manifests.tmp/crds.yaml"
	cp -r "$istio_dir/manifests/charts/istio-control/istio-discovery" "$dir/.istio-manifests.tmp/istio-discovery"
	chmod -R u+w "$dir/.istio-manifests.tmp"
	mv "$dir/.istio-manifests.tmp" "$dir/istio-manifests"
fi

if $node; then
	for name in kubelet kube-controller-manager kube-scheduler kubectl; do
		build "$name" test/tools "./$name" \
			-ldflags "-X k8s.io/component-base/version.gitVersion=$kube_version"
	done
fi
