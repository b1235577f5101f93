// Package istiod runs Istio's own control plane for tests: pilot-discovery,
// built by scripts/tools.sh from the istio.io/istio module pinned in
// test/tools/istio, as a child process out of cluster against a test API
// server (test/kubeenv), every port on loopback. It is, at once, the CA
// (IstioCertificateService over TLS, authenticating callers by TokenReview,
// with CA_TRUSTED_NODE_ACCOUNTS for node agents), the xDS server (state of
// the world and delta ADS, for Envoy and proxyless gRPC), the trust source
// (ConfigMap istio-ca-root-cert in every namespace, ProxyConfig over xDS) and,
// given an injector ConfigMap, the sidecar injector. docs/istio.md says which
// istiod settings each of meshagent's shapes needs.
//
// Its CA is istiod's self-signed one (the root kept in the Secret
// istio-system/istio-ca-secret) unless Options.PluginCA plugs one in: the
// files istiod reads from ROOT_CA_DIR ("cacerts"), which SetPluginCA replaces
// while istiod runs, as a root rotation does.
//
// ApplyCRDs applies Istio's CRDs from the same module (once per API server).
// The Istiod owns its process, its ports and a directory of its own (mesh
// config, kubeconfig, plug-in CA files, log); the objects it makes in the
// API server outlive it.
package istiod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// API is the API server istiod runs against, as an admin.
type API struct {
	Client kubernetes.Interface
	Config *rest.Config
	// WriteKubeconfig writes an admin kubeconfig for istiod to path.
	WriteKubeconfig func(path string) error
}

// APIOf is the API of a test API server (test/kubeenv).
func APIOf(env *kubeenv.Env) API {
	return API{Client: env.Client(), Config: env.Config(),
		WriteKubeconfig: func(path string) error { return env.Kubeconfig(path, env.AdminToken()) }}
}

// Standard ports, as istiod's in a cluster: Options.StandardPorts.
const (
	XDSPort        = 15010
	SecurePort     = 15012
	HTTPPort       = 8080
	WebhookPort    = 15017
	MonitoringPort = 15014
	CtrlzPort      = 9876
)

const (
	// Namespace is istiod's namespace (its POD_NAMESPACE and the mesh's root namespace).
	Namespace = "istio-system"
	// ServerName is the name on istiod's serving certificate that clients check
	// (ISTIOD_SAN): the host of the mesh config's discoveryAddress.
	ServerName = "istiod.istio-system.svc"
	// Audience is the token audience istiod's CA accepts.
	Audience = "istio-ca"
	// RootConfigMap is the ConfigMap istiod writes its roots to in every namespace,
	// key RootKey.
	RootConfigMap = "istio-ca-root-cert"
	RootKey       = "root-cert.pem"
	// ClusterID is the cluster name istiod runs as (ISTIO_META_CLUSTER_ID).
	ClusterID = "Kubernetes"
	// TrustDomain is the mesh's trust domain.
	TrustDomain = "cluster.local"
)

// PluginCA is the plug-in CA istiod signs with ("cacerts"): its signing
// certificate and key, the chain from it to the root, and the roots the mesh
// trusts (old and new during a rotation).
type PluginCA struct {
	CertPEM, KeyPEM, ChainPEM, RootsPEM []byte
}

// Options configure Start. The zero value is a working istiod with a
// self-signed CA.
type Options struct {
	// TrustedNodeAccounts are the service accounts ("namespace/name") allowed to ask
	// for certificates on behalf of pods of their node (CA_TRUSTED_NODE_ACCOUNTS).
	TrustedNodeAccounts []string
	// PluginCA, when set, is written to ROOT_CA_DIR before istiod starts.
	PluginCA *PluginCA
	// Injector, when set, turns istiod's sidecar injector on (its HTTPS port
	// serves /inject).
	Injector *Injector
	// MeshConfig is YAML appended to the mesh config istiod starts with.
	MeshConfig string
	// Env is appended to istiod's environment (a variable given here overrides the
	// default of the same name).
	Env []string
	// StartTimeout bounds the wait for /ready and the root ConfigMap. Zero means 90 s.
	StartTimeout time.Duration
	// Host is the address istiod listens on; empty means 127.0.0.1. With
	// StandardPorts its ports are istiod's usual ones, else free ports.
	Host          string
	StandardPorts bool
	// Netns, when set, is the network namespace (a path under /run/netns)
	// istiod runs in, through nsenter; InNetns then runs the readiness checks
	// there.
	Netns   string
	InNetns func(func() error) error
}

// Istiod is one running pilot-discovery. Create it with Start, end it with Stop.
type Istiod struct {
	api  API
	opts Options
	dir  string
	bin  string
	args []string
	env  []string

	// XDSAddr is the plaintext xDS port (15010 in a cluster); SecureAddr the TLS
	// one that serves xDS and the CA (15012); HTTPAddr the debug port (8080);
	// WebhookAddr the injector's HTTPS port (15017); MonitoringAddr /metrics (15014).
	XDSAddr, SecureAddr, HTTPAddr, WebhookAddr, MonitoringAddr string

	mu   sync.Mutex
	proc *process
}

// Start applies Istio's CRDs if the API server has none, starts istiod and
// returns once it is ready and has published its root in its own namespace.
func Start(ctx context.Context, api API, opts Options) (*Istiod, error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 90 * time.Second
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.InNetns == nil {
		opts.InNetns = func(f func() error) error { return f() }
	}
	bin, err := kubeenv.ToolPath("pilot-discovery")
	if err != nil {
		return nil, err
	}
	if err := ApplyCRDs(ctx, api.Config); err != nil {
		return nil, err
	}
	if err := ensureNamespace(ctx, api.Client, Namespace); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "istiod-")
	if err != nil {
		return nil, fmt.Errorf("istiod: %w", err)
	}
	i := &Istiod{api: api, opts: opts, dir: dir, bin: bin}
	if err := i.prepare(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if opts.Injector != nil {
		cm, err := renderInjector(*opts.Injector, dir)
		if err == nil {
			err = applyConfigMap(ctx, api.Client, cm)
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := i.start(ctx); err != nil {
		i.Stop()
		return nil, err
	}
	return i, nil
}

// prepare picks the ports and writes the files istiod starts from.
func (i *Istiod) prepare() error {
	ports := []int{XDSPort, SecurePort, HTTPPort, WebhookPort, MonitoringPort, CtrlzPort}
	if !i.opts.StandardPorts {
		var err error
		if ports, err = freePorts(len(ports)); err != nil {
			return fmt.Errorf("istiod: finding free ports: %w", err)
		}
	}
	addr := func(p int) string { return net.JoinHostPort(i.opts.Host, strconv.Itoa(p)) }
	i.XDSAddr, i.SecureAddr, i.HTTPAddr = addr(ports[0]), addr(ports[1]), addr(ports[2])
	i.WebhookAddr, i.MonitoringAddr = addr(ports[3]), addr(ports[4])

	kubeconfig := filepath.Join(i.dir, "kubeconfig")
	if err := i.api.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	mesh := filepath.Join(i.dir, "mesh.yaml")
	meshConfig := "trustDomain: " + TrustDomain + "\nrootNamespace: " + Namespace +
		"\ndefaultConfig:\n  discoveryAddress: " + ServerName + ":15012\n" + i.opts.MeshConfig
	if err := os.WriteFile(mesh, []byte(meshConfig), 0o600); err != nil {
		return fmt.Errorf("istiod: %w", err)
	}
	caDir := i.caDir()
	if err := os.MkdirAll(caDir, 0o700); err != nil {
		return fmt.Errorf("istiod: %w", err)
	}
	if i.opts.PluginCA != nil {
		if err := i.SetPluginCA(*i.opts.PluginCA); err != nil {
			return err
		}
	}
	i.args = []string{"discovery",
		"--kubeconfig", kubeconfig,
		"--meshConfig", mesh,
		"--httpAddr", i.HTTPAddr,
		"--httpsAddr", i.WebhookAddr,
		"--grpcAddr", i.XDSAddr,
		"--secureGRPCAddr", i.SecureAddr,
		"--monitoringAddr", i.MonitoringAddr,
		"--ctrlz_address", i.opts.Host,
		"--ctrlz_port", strconv.Itoa(ports[5]),
		"--domain", TrustDomain,
		"--clusterID", ClusterID,
		"--log_output_level", "default:info",
	}
	i.env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + i.dir,
		"POD_NAMESPACE=" + Namespace,
		"POD_NAME=istiod-test",
		"REVISION=default",
		"JWT_POLICY=third-party-jwt",
		"PILOT_CERT_PROVIDER=istiod",
		"ROOT_CA_DIR=" + caDir,
		"CA_TRUSTED_NODE_ACCOUNTS=" + strings.Join(i.opts.TrustedNodeAccounts, ","),
		// istiod serves ProxyConfig (its trust bundle) over xDS only with this on.
		"ISTIO_MULTIROOT_MESH=true",
		"PILOT_ENABLE_GATEWAY_API=false",
		"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false",
		"VALIDATION_WEBHOOK_CONFIG_NAME=",
		"INJECTION_WEBHOOK_CONFIG_NAME=",
	}, i.opts.Env...)
	return nil
}

func (i *Istiod) caDir() string { return filepath.Join(i.dir, "cacerts") }

func (i *Istiod) start(ctx context.Context) error {
	bin, args := i.bin, i.args
	if i.opts.Netns != "" {
		bin, args = "nsenter", append([]string{"--net=" + i.opts.Netns, "--", i.bin}, i.args...)
	}
	p, err := startProcess(bin, args, i.env, filepath.Join(i.dir, "istiod.log"), i.opts.Netns == "")
	if err != nil {
		return err
	}
	i.mu.Lock()
	i.proc = p
	i.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, i.opts.StartTimeout)
	defer cancel()
	wait := func(what string, ready func(context.Context) error) error {
		var last error
		for {
			attempt, done := context.WithTimeout(ctx, 5*time.Second)
			last = ready(attempt)
			done()
			if last == nil {
				return nil
			}
			select {
			case <-p.done:
				return fmt.Errorf("istiod exited: %v\n%s", p.err, i.LogTail())
			case <-ctx.Done():
				return fmt.Errorf("istiod: %s within %v: %v\n%s", what, i.opts.StartTimeout, last, i.LogTail())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	ready := func(ctx context.Context) error { return httpOK(ctx, "http://"+i.HTTPAddr+"/ready", i.opts.InNetns) }
	if err := wait("ready", ready); err != nil {
		return err
	}
	return wait("root published", func(ctx context.Context) error {
		_, err := i.Roots(ctx, Namespace)
		return err
	})
}

// Roots returns the roots istiod has published in namespace (ConfigMap
// istio-ca-root-cert), as the agents' trust sources read them.
func (i *Istiod) Roots(ctx context.Context, namespace string) ([]byte, error) {
	cm, err := i.api.Client.CoreV1().ConfigMaps(namespace).Get(ctx, RootConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("istiod: roots in %s: %w", namespace, err)
	}
	root := cm.Data[RootKey]
	if root == "" {
		return nil, fmt.Errorf("istiod: ConfigMap %s/%s has no %s", namespace, RootConfigMap, RootKey)
	}
	return []byte(root), nil
}

// SetPluginCA writes the plug-in CA's files into ROOT_CA_DIR, each by rename,
// the key and certificate first and the roots last; a running istiod watches
// the directory and moves to them.
func (i *Istiod) SetPluginCA(ca PluginCA) error {
	for _, f := range []struct {
		name string
		b    []byte
	}{{"ca-key.pem", ca.KeyPEM}, {"ca-cert.pem", ca.CertPEM}, {"cert-chain.pem", ca.ChainPEM}, {"root-cert.pem", ca.RootsPEM}} {
		tmp := filepath.Join(i.caDir(), "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.b, 0o600); err != nil {
			return fmt.Errorf("istiod: plug-in CA: %w", err)
		}
		if err := os.Rename(tmp, filepath.Join(i.caDir(), f.name)); err != nil {
			return fmt.Errorf("istiod: plug-in CA: %w", err)
		}
	}
	return nil
}

// Restart stops istiod and starts it again on the same ports, as a rollout
// of istiod does to its clients.
func (i *Istiod) Restart(ctx context.Context) error {
	i.mu.Lock()
	p := i.proc
	i.mu.Unlock()
	if err := p.stop(); err != nil {
		return err
	}
	return i.start(ctx)
}

// Stop stops istiod and removes its directory. It may be called more than once.
func (i *Istiod) Stop() error {
	i.mu.Lock()
	p := i.proc
	i.mu.Unlock()
	var err error
	if p != nil {
		err = p.stop()
	}
	return errors.Join(err, os.RemoveAll(i.dir))
}

// Log returns what istiod has logged so far.
func (i *Istiod) Log() string {
	b, err := os.ReadFile(filepath.Join(i.dir, "istiod.log"))
	if err != nil {
		return fmt.Sprintf("(istiod log: %v)", err)
	}
	return string(b)
}

// LogTail returns the end of istiod's log, for failure messages.
func (i *Istiod) LogTail() string {
	l := i.Log()
	if len(l) > 6000 {
		l = l[len(l)-6000:]
	}
	return "--- end of istiod's log ---\n" + l
}

// RSS returns istiod's resident memory in bytes (VmRSS).
func (i *Istiod) RSS() (int64, error) {
	i.mu.Lock()
	p := i.proc
	i.mu.Unlock()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("istiod: no VmRSS")
}

func ensureNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("istiod: namespace %s: %w", name, err)
	}
	return nil
}

// process is istiod's child process; done is closed once it exited.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProcess starts bin; with deathSignal it is killed if the test binary
// dies (not through nsenter: the signal fires when the forking thread ends,
// and the threads that enter a network namespace end).
func startProcess(bin string, args, env []string, logPath string, deathSignal bool) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("istiod: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	if deathSignal {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("istiod: starting %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, waits up to 15 s, then kills.
func (p *process) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return errors.New("istiod: did not exit within 15 s of SIGTERM; killed")
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// httpOK GETs url over a connection dialled inside inNetns (the transport
// dials on goroutines of its own: a thread switched to another network
// namespace would not be theirs).
func httpOK(ctx context.Context, url string, inNetns func(func() error) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetns(func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", url, resp.Status, strings.TrimSpace(body.String()))
	}
	return nil
}
