// Package pilotagent runs Istio's real pilot-agent (built by scripts/tools.sh from the
// pinned istio.io/istio module) beside meshagent, with test/e2e/images/envoy standing in
// for Envoy, the way istiod's sidecar injector runs it in a pod: the test here shows on
// loopback, without a cluster, everything an istio-proxy container needs.
//
// What pilot-agent needed here (pilot-agent 1.31-dev; paths relative to its working
// directory, which is / in a container, so each is the absolute path in an image):
//
//   - args, as Istio's injection template passes them: `proxy sidecar --domain
//     $(POD_NAMESPACE).svc.cluster.local --proxyLogLevel=warning
//     --proxyComponentLogLevel=misc:error --log_output_level=default:info`;
//   - env, as the template sets it: POD_NAME, POD_NAMESPACE, INSTANCE_IP, SERVICE_ACCOUNT,
//     HOST_IP, PILOT_CERT_PROVIDER=istiod, CA_ADDR, PROXY_CONFIG (JSON; discoveryAddress,
//     and here binaryPath, proxyAdminPort and statusPort to keep off fixed ports),
//     ISTIO_META_CLUSTER_ID, ISTIO_META_INTERCEPTION_MODE, TRUST_DOMAIN and
//     ISTIO_META_MESH_ID; ENVOY_STATUS_PORT (15021) and ENVOY_PROMETHEUS_PORT (15090)
//     move the bootstrap's health and Prometheus listeners;
//   - var/lib/istio/envoy/envoy_bootstrap_tmpl.json: Envoy's bootstrap template
//     (tools/packaging/common/envoy_bootstrap.json of the module; BootstrapTemplate), read
//     by pilot-agent at start (pkg/bootstrap DefaultCfgDir; ISTIO_BOOTSTRAP overrides);
//     without it pilot-agent cannot start Envoy;
//   - /usr/local/bin/envoy: the Envoy binary (ProxyConfig binaryPath's default), started
//     as `envoy -c etc/istio/proxy/envoy-rev.json --drain-time-s 45 --drain-strategy
//     immediate --local-address-ip-version v4 --file-flush-interval-msec 1000
//     --disable-hot-restart --allow-unknown-static-fields -l warning --component-log-level
//     misc:error --skip-deprecated-logs`, with pilot-agent's environment and working
//     directory (and as uid 1337 only when pilot-agent runs as root with DNS capture on
//     :53);
//   - var/run/secrets/istio/root-cert.pem: the root that signs istiod's serving
//     certificate (the istiod-ca-cert volume, ConfigMap istio-ca-root-cert). pilot-agent
//     exits at start without it ("failed to find root CA cert for XDS"), even when the
//     workload's certificate comes from another socket;
//   - var/run/secrets/tokens/istio-token: the token pilot-agent's xDS proxy sends to istiod
//     (the istio-token projected volume, audience istio-ca);
//   - writable by uid 1337 (the injection template's runAsUser and runAsGroup; the test
//     runs pilot-agent, and so Envoy, as 1337:1337 with the image's files owned by root):
//     etc/istio/proxy (envoy-rev.json, the XDS socket and a grpc-bootstrap.json; the
//     istio-envoy emptyDir), var/run/secrets/credential-uds (pilot-agent's files-only SDS
//     socket; the credential-socket emptyDir), var/lib/istio/data (istio-data);
//     var/run/secrets/workload-spiffe-uds only needs to let 1337 reach meshagent's socket
//     (an emptyDir is 0777; meshagent keeps an existing directory's mode and makes its
//     socket 0666, but a directory it creates itself is 0750 and would shut 1337 out);
//   - the socket var/run/secrets/workload-spiffe-uds/socket answering when pilot-agent
//     starts: it then logs "Existing workload SDS socket found", serves only file
//     certificates, creates no CA client and sends no CSR ("Skipping connecting to CA"),
//     and the bootstrap's sds-grpc cluster is that socket.
//
// pilot-agent reports ready (/healthz/ready on its status port, and on 15021 through
// Envoy's health listener) only once Envoy's admin /stats show a CDS and an LDS update:
// with no control plane answering, it stays 503 ("config not received from XDS server").
package pilotagent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// IstioModuleDir is the source of the istio.io/istio module test/tools/istio pins, in
// the module cache (scripts/tools.sh downloads it when it builds pilot-agent).
func IstioModuleDir() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio")
	cmd.Dir = filepath.Join(repoRoot(), "test", "tools", "istio")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating istio.io/istio (run make tools): %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("istio.io/istio is not in the module cache: run make tools")
	}
	return dir, nil
}

// BootstrapTemplateImagePath is where pilot-agent reads Envoy's bootstrap template in
// Istio's proxy image.
const BootstrapTemplateImagePath = "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"

// BootstrapTemplate is the path of Envoy's bootstrap template in the pinned module.
func BootstrapTemplate() (string, error) {
	dir, err := IstioModuleDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "tools", "packaging", "common", "envoy_bootstrap.json")
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}

// ProxyUID is the uid and gid Istio's injection template runs istio-proxy as
// (runAsUser and runAsGroup 1337).
const ProxyUID = 1337

// ProxyImageArgs are tools/image's arguments (bin/image-tool, `make image`'s tool) for an
// istio-proxy image laid out as Istio's proxyv2 (pilot/docker/Dockerfile.proxyv2 in the
// module): pilot-agent at /usr/local/bin/pilot-agent as the entry point, envoy (the
// stand-in) at /usr/local/bin/envoy, the bootstrap template at
// BootstrapTemplateImagePath, working directory /, run as ProxyUID. The directories
// pilot-agent writes are made owned by ProxyUID too, for a pod that mounts no volume on
// them (the injection template mounts emptyDirs on each, and the root file system is
// then read-only).
func ProxyImageArgs(pilotAgent, envoy, template, tag, out string) []string {
	uid := fmt.Sprintf("%d:%d", ProxyUID, ProxyUID)
	return []string{
		"-binary", pilotAgent, "-path", "/usr/local/bin/pilot-agent", "-user", uid,
		"-add", envoy + ":/usr/local/bin/envoy",
		"-add", template + ":" + BootstrapTemplateImagePath + ":0644",
		"-dir", "/etc/istio/proxy", "-dir", "/var/lib/istio/data",
		"-dir", "/var/run/secrets/credential-uds", "-dir", "/var/run/secrets/workload-spiffe-uds:0777",
		"-tag", tag, "-o", out,
	}
}

// BuildStandIn builds test/e2e/images/envoy, the Envoy stand-in, statically into out.
func BuildStandIn(out string) error {
	cmd := exec.Command("go", "build", "-o", out, "./test/e2e/images/envoy")
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the Envoy stand-in: %w: %s", err, b)
	}
	return nil
}
