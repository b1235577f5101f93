package kubeenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Issuer is the service-account token issuer of the test API server.
const Issuer = "https://kubernetes.default.svc.cluster.local"

// AdminUser is the user name of the static admin token (group system:masters).
const AdminUser = "meshagent-test-admin"

// Options configure Start. The zero value is a working server.
type Options struct {
	// Dir holds the processes' state and logs. Empty means a new temporary directory,
	// removed by Stop; a given directory is kept.
	Dir string
	// APIServerFlags are appended to the API server's command line; a flag given here
	// overrides the default of the same name (the last occurrence wins).
	APIServerFlags []string
	// Nodes get a static token each (NodeToken), for user system:node:<name>
	// in group system:nodes: the identity of the node's kubelet, to which
	// the Node authorizer (and, with --enable-admission-plugins=NodeRestriction,
	// the node restriction) applies. The Node objects are not created.
	Nodes []string
	// StartTimeout bounds the wait for each process to become ready, in Start and
	// Restart. Zero means 90 seconds (a loaded 2-core machine can take 20).
	StartTimeout time.Duration
}

// Env is a running etcd and kube-apiserver pair. Create it with Start, end it with Stop.
type Env struct {
	opts   Options
	dir    string
	ownDir bool

	etcdBin, apiBin string
	etcdArgs        []string
	apiArgs         []string
	host            string // https://127.0.0.1:<port>
	caPEM           []byte // the CA of the API server's serving certificate
	adminToken      string
	nodeTokens      map[string]string

	etcd, api *process
	config    *rest.Config
	client    kubernetes.Interface

	stopOnce sync.Once
	stopErr  error
}

// Start starts etcd and kube-apiserver on free loopback ports and returns once the API
// server's /readyz answers 200. A failure cleans up what was started and names the
// process, with the end of its log.
func Start(ctx context.Context, opts Options) (*Env, error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 90 * time.Second
	}
	etcdBin, err := ToolPath("etcd")
	if err != nil {
		return nil, err
	}
	apiBin, err := ToolPath("kube-apiserver")
	if err != nil {
		return nil, err
	}
	// A port found free may be taken before the process binds it; try again with
	// new ports when that is why a process exited.
	for attempt := 1; ; attempt++ {
		e, err := start(ctx, opts, etcdBin, apiBin)
		if err == nil || !errors.Is(err, errPortInUse) || attempt == 3 {
			return e, err
		}
	}
}

func start(ctx context.Context, opts Options, etcdBin, apiBin string) (_ *Env, err error) {
	e := &Env{opts: opts, dir: opts.Dir, etcdBin: etcdBin, apiBin: apiBin}
	if e.dir == "" {
		e.dir, err = os.MkdirTemp("", "kubeenv-")
		if err != nil {
			return nil, fmt.Errorf("kubeenv: %w", err)
		}
		e.ownDir = true
	} else if err := os.MkdirAll(e.dir, 0o700); err != nil {
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()

	ports, err := freePorts(3)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: finding free ports: %w", err)
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	e.host = fmt.Sprintf("https://127.0.0.1:%d", ports[2])

	files, err := writeFiles(e.dir, opts.Nodes)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	e.caPEM = files.caPEM
	e.adminToken = files.adminToken
	e.nodeTokens = files.nodeTokens

	e.etcdArgs = etcdArgs(e.dir, clientURL, peerURL)
	e.apiArgs = apiServerArgs(clientURL, ports[2], files, opts.APIServerFlags)

	e.etcd, err = startProcess("etcd", e.etcdBin, e.etcdArgs, filepath.Join(e.dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	if err := e.waitReady(ctx, e.etcd, func(ctx context.Context) error {
		return httpOK(ctx, clientURL+"/health")
	}); err != nil {
		return nil, err
	}

	e.config = &rest.Config{
		Host:            e.host,
		BearerToken:     e.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.caPEM},
		// Tests create objects in bursts (hundreds of pods); the client's default
		// limit of 5 requests per second would make them slow, not more real.
		QPS:   500,
		Burst: 1000,
	}
	e.client, err = kubernetes.NewForConfig(e.config)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	if err := e.startAPIServer(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// etcdArgs are the flags of the environment's etcd.
func etcdArgs(dir, clientURL, peerURL string) []string {
	return []string{
		"--name=kubeenv",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kubeenv=" + peerURL,
		// Test data need not survive a power cut; fsync dominates etcd's latency.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}
}

// apiServerArgs are the flags of the environment's kube-apiserver, then
// extra.
func apiServerArgs(etcdURL string, port int, files files, extra []string) []string {
	return append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// The API server refuses a loopback advertise address unless it does not
		// maintain the kubernetes service's endpoints.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + files.servingCert,
		"--tls-private-key-file=" + files.servingKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=" + Issuer,
		"--service-account-key-file=" + files.saPublic,
		"--service-account-signing-key-file=" + files.saPrivate,
		"--authorization-mode=Node,RBAC",
		"--token-auth-file=" + files.tokens,
		"--allow-privileged=true",
		// Open watches end 2s after SIGTERM: without it the server waits for
		// every watch to close, and Restart and Stop with a client watching
		// (an informer) run into stopGrace.
		"--shutdown-watch-termination-grace-period=2s",
	}, extra...)
}

func (e *Env) startAPIServer(ctx context.Context) error {
	var err error
	e.api, err = startProcess("kube-apiserver", e.apiBin, e.apiArgs, filepath.Join(e.dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	return e.waitReady(ctx, e.api, func(ctx context.Context) error {
		_, err := e.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}

// waitReady polls ready until it succeeds, the process exits, or the start timeout
// passes. Either failure carries the end of the process's log.
func (e *Env) waitReady(ctx context.Context, p *process, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, e.opts.StartTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		attemptCtx, attemptCancel := context.WithTimeout(ctx, 5*time.Second)
		last = ready(attemptCtx)
		attemptCancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.exitError()
		case <-ctx.Done():
			return fmt.Errorf("kubeenv: %s not ready (start timeout %v): %w (last check: %v)\n%s",
				p.name, e.opts.StartTimeout, ctx.Err(), last, p.logTail())
		case <-tick.C:
		}
	}
}

// Restart stops the API server and starts it again on the same port with the same
// flags, keeping etcd (and so every object) running. It returns once /readyz answers.
func (e *Env) Restart(ctx context.Context) error {
	if err := e.api.stop(); err != nil {
		return err
	}
	return e.startAPIServer(ctx)
}

// Stop stops the API server and etcd and removes the directory Start made. It is safe
// to call twice; the second call returns the first's result.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		var errs []error
		for _, p := range []*process{e.api, e.etcd} {
			if p != nil {
				errs = append(errs, p.stop())
			}
		}
		if e.ownDir {
			errs = append(errs, os.RemoveAll(e.dir))
		}
		e.stopErr = errors.Join(errs...)
	})
	return e.stopErr
}

// Config returns a copy of the admin's client configuration (group system:masters).
func (e *Env) Config() *rest.Config { return rest.CopyConfig(e.config) }

// Client returns a clientset authenticated as the admin.
func (e *Env) Client() kubernetes.Interface { return e.client }

// Host is the API server's URL, https://127.0.0.1:<port>.
func (e *Env) Host() string { return e.host }

// CACert returns the PEM of the CA that signed the API server's serving certificate.
func (e *Env) CACert() []byte { return append([]byte(nil), e.caPEM...) }

// AdminToken returns the static bearer token of the admin.
func (e *Env) AdminToken() string { return e.adminToken }

// NodeToken returns the static token of node name's kubelet (Options.Nodes),
// or "" for a node not in Options.Nodes.
func (e *Env) NodeToken(name string) string { return e.nodeTokens[name] }

// Dir is the directory holding the processes' state and their logs (etcd.log,
// kube-apiserver.log).
func (e *Env) Dir() string { return e.dir }

// ConfigForToken returns a client configuration that authenticates with token, for
// acting as a service account or another non-admin identity.
func (e *Env) ConfigForToken(token string) *rest.Config {
	c := rest.AnonymousClientConfig(e.config)
	c.BearerToken = token
	return c
}

// Kubeconfig writes a kubeconfig file (mode 0600) for this API server that
// authenticates with token: AdminToken() for the admin, a service account's token for
// anyone else. Programs under test read it through KUBECONFIG.
func (e *Env) Kubeconfig(path, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeenv"] = &clientcmdapi.Cluster{
		Server:                   e.host,
		CertificateAuthorityData: e.caPEM,
	}
	cfg.AuthInfos["kubeenv"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubeenv"] = &clientcmdapi.Context{Cluster: "kubeenv", AuthInfo: "kubeenv"}
	cfg.CurrentContext = "kubeenv"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("kubeenv: writing kubeconfig: %w", err)
	}
	return os.Chmod(path, 0o600)
}

var errPortInUse = errors.New("port in use")

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	// A client of its own, so no idle connection outlives the test.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func isPortInUse(log string) bool {
	return strings.Contains(log, "address already in use")
}
