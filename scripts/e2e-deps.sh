#!/usr/bin/env bash
# Installs what the end-to-end cluster (test/e2e/cluster) needs from the distribution
# when it is missing: containerd, runc, the CNI plugins and iptables (Debian packages).
set -euo pipefail

missing=()
command -v containerd >/dev/null 2>&1 || missing+=(containerd)
command -v runc >/dev/null 2>&1 || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ "${#missing[@]}" -gt 0 ]; then
	echo "e2e: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
