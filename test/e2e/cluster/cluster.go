package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// Addresses inside the cluster's network namespace: nothing outside it uses them.
const (
	NetnsName   = "meshagent-e2e"
	NodeName    = "meshagent-e2e-node"
	NodeIP      = "10.111.0.1"
	ServiceIP   = "10.96.0.1" // the kubernetes Service: first address of ServiceCIDR
	ServiceCIDR = "10.96.0.0/24"
	PodCIDR     = "10.112.0.0/24"
	CgroupRoot  = "/meshagent-e2e"
	KubeletDir  = "/var/lib/kubelet"
	// PauseImage is containerd's sandbox image, built locally (no registry is reachable).
	PauseImage = "meshagent.test/pause:e2e"
)

// runDir holds the sockets (a short path: Unix socket paths are limited to 108 bytes).
const runDir = "/run/meshagent-e2e"

// Config describes a cluster.
type Config struct {
	// Images are archives (docker-save format) imported into containerd before the
	// kubelet starts. The pause image (PauseImage) must be among them.
	Images []string
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// Cluster is a running single-node cluster.
type Cluster struct {
	cfg            Config
	dir            string // work directory: configs, logs, etcd data, containerd root
	netnsPath      string
	tools          map[string]string
	procs          map[string]*process
	sysctls        map[string]string
	created        []string // directories Start made that Stop removes
	createdAtStart []string // the same list, kept for Leftovers
	token          string   // admin bearer token
	caPEM          []byte
	rest           *rest.Config
	client         kubernetes.Interface
}

// Tools are the programs a cluster runs, built by scripts/tools.sh -node.
var Tools = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "helm"}

// Start makes the network namespace and starts every component, returning once the
// node is Ready. On failure everything made so far is torn down.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("cluster: needs root")
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	c := &Cluster{cfg: cfg, tools: map[string]string{}, procs: map[string]*process{}}
	if err := c.findTools(); err != nil {
		return nil, err
	}
	// A run that was killed leaves its state behind: clear it first.
	c.sysctls = readSysctls()
	c.cleanLeftovers()

	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	c.dir, err = os.MkdirTemp("", "meshagent-e2e-")
	if err != nil {
		return nil, err
	}
	for _, d := range []string{KubeletDir, "/var/log/pods", "/var/log/containers", runDir, "/run/containerd", "/var/lib/cni", "/run/netns"} {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			c.created = append(c.created, d)
		}
	}
	c.createdAtStart = append([]string(nil), c.created...)
	if err := os.MkdirAll(filepath.Join(c.dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, err
	}
	if err := c.makeNetns(); err != nil {
		return nil, err
	}
	if err := makeCgroupRoot(CgroupRoot); err != nil {
		return nil, fmt.Errorf("cluster: cgroup root: %w", err)
	}
	if err := c.writeFiles(); err != nil {
		return nil, err
	}
	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"containerd", c.startContainerd},
		{"images", c.importImages},
		{"kube-controller-manager", c.startControllerManager},
		{"kube-scheduler", c.startScheduler},
		{"kubelet", c.StartKubelet},
		{"node ready", c.waitNodeReady},
	}
	for _, s := range steps {
		start := time.Now()
		if err := s.f(ctx); err != nil {
			return nil, fmt.Errorf("cluster: %s: %w; the end of its log:\n%s", s.name, err, c.Logs(s.name, 15))
		}
		c.logf("%s: %.1fs", s.name, time.Since(start).Seconds())
	}
	return c, nil
}

// findTools finds the programs the cluster runs: the built ones and the
// system's.
func (c *Cluster) findTools() error {
	for _, t := range Tools {
		p, err := kubeenv.ToolPath(t)
		if err != nil {
			return fmt.Errorf("%w (scripts/tools.sh -node builds the node's tools)", err)
		}
		c.tools[t] = p
	}
	for _, t := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "ip"} {
		p, err := exec.LookPath(t)
		if err != nil {
			return fmt.Errorf("cluster: %s not found (apt-get install containerd runc containernetworking-plugins iptables): %w", t, err)
		}
		c.tools[t] = p
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return fmt.Errorf("cluster: CNI plugins not found (apt-get install containernetworking-plugins): %w", err)
	}
	return nil
}

func (c *Cluster) logf(format string, args ...any) { c.cfg.Logf("cluster: "+format, args...) }

// Dir is the work directory: component configs and logs (logs/<name>.log).
func (c *Cluster) Dir() string { return c.dir }

// Client is an admin client of the API server.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// RESTConfig is an admin configuration whose connections are made inside the
// cluster's network namespace.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Kubeconfig is the admin kubeconfig for kubectl and helm run by Command.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.dir, "admin.kubeconfig") }

// Command runs a tool ("kubectl", "helm") inside the network namespace with the admin
// kubeconfig.
func (c *Cluster) Command(ctx context.Context, tool string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + c.netnsPath, "--", c.tools[tool]}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig(), "HOME="+c.dir, "HELM_CACHE_HOME="+filepath.Join(c.dir, "helm"),
		"HELM_CONFIG_HOME="+filepath.Join(c.dir, "helm"), "HELM_DATA_HOME="+filepath.Join(c.dir, "helm"))
	return cmd
}

// Listen listens on addr inside the network namespace (a test server pods can reach
// at NodeIP).
func (c *Cluster) Listen(network, addr string) (net.Listener, error) {
	var lis net.Listener
	err := inNetnsPath(c.netnsPath, func() error {
		var err error
		lis, err = net.Listen(network, addr)
		return err
	})
	return lis, err
}

func (c *Cluster) makeNetns() error {
	if err := run(c.tools["ip"], "netns", "add", NetnsName); err != nil {
		return err
	}
	c.netnsPath = filepath.Join("/run/netns", NetnsName)
	for _, args := range [][]string{
		{"-n", NetnsName, "link", "set", "lo", "up"},
		{"-n", NetnsName, "addr", "add", NodeIP + "/32", "dev", "lo"},
		{"-n", NetnsName, "addr", "add", ServiceIP + "/32", "dev", "lo"},
	} {
		if err := run(c.tools["ip"], args...); err != nil {
			return err
		}
	}
	return nil
}

// httpsReady polls url (inside the namespace, trusting the cluster CA) until it answers 200.
func (c *Cluster) httpsReady(ctx context.Context, url string, p *process) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext:     dialIn(c.netnsPath),
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
	return c.poll(ctx, p, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	})
}

// poll calls f until it succeeds, the process p (if any) exits, or 90 s pass.
func (c *Cluster) poll(ctx context.Context, p *process, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited: %v (last check: %v)", p.name, p.err, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Stop tears everything down; it is safe to call on a cluster that failed to start,
// and twice. Errors are returned after every step has been tried.
func (c *Cluster) Stop() error {
	var errs []error
	if p := c.procs["kubelet"]; p != nil {
		p.stop(10 * time.Second)
	}
	if p := c.procs["containerd"]; p != nil && !p.exited() {
		if err := c.removeSandboxes(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range []string{"kube-scheduler", "kube-controller-manager", "containerd", "kube-apiserver", "etcd"} {
		c.procs[name].stop(10 * time.Second)
	}
	errs = append(errs, c.cleanLeftovers())
	for i := len(c.created) - 1; i >= 0; i-- {
		d := c.created[i]
		if d == "/run/netns" {
			// Shared by every network namespace on the machine: removed only if empty.
			os.Remove(d)
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	c.created = nil
	if c.dir != "" && os.Getenv("MESHAGENT_E2E_KEEP") == "" {
		// Logs are kept on failure by the caller copying them first.
		os.RemoveAll(c.dir)
	}
	if err := restoreSysctls(c.sysctls); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cleanLeftovers removes mounts, cgroups and the namespace of this cluster (or of a
// run that was killed before it could tear down).
func (c *Cluster) cleanLeftovers() error {
	var errs []error
	// Pod sandboxes' network namespaces are mounted under /run/netns as cni-<id>;
	// only those under the kubelet's and containerd's trees are unmounted here, the
	// sandboxes' own are removed through the CRI.
	dirs := []string{KubeletDir, runDir}
	if c.dir != "" {
		dirs = append(dirs, c.dir)
	}
	if err := unmountUnder(dirs...); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroupRoot(CgroupRoot); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", NetnsName)); err == nil {
		if err := run("ip", "netns", "delete", NetnsName); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Logs returns the tail of a component's log, for failure messages.
func (c *Cluster) Logs(name string, lines int) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "logs", name+".log"))
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// NetnsPath is the cluster's network namespace (for nsenter --net).
func (c *Cluster) NetnsPath() string { return c.netnsPath }

// AddLocalAddress puts ip on the network namespace's loopback, as the kubernetes
// Service's address is: a host process listening there is what pods reach at that
// address (there is no kube-proxy), so a Service given that ClusterIP reaches it.
func (c *Cluster) AddLocalAddress(ip string) error {
	return run(c.tools["ip"], "-n", NetnsName, "addr", "add", ip+"/32", "dev", "lo")
}

// InNetns runs f on a thread inside the cluster's network namespace: listeners and
// connections f makes stay there.
func (c *Cluster) InNetns(f func() error) error { return inNetnsPath(c.netnsPath, f) }

// Leftovers lists what a stopped cluster left on the machine: its network namespace,
// cgroups under CgroupRoot, mounts under the kubelet's and containerd's directories,
// and directories Start created. Empty after a clean Stop.
func (c *Cluster) Leftovers() []string {
	var left []string
	if _, err := os.Stat(filepath.Join("/run/netns", NetnsName)); err == nil {
		left = append(left, "network namespace "+NetnsName)
	}
	if hs, err := cgroupHierarchies(); err == nil {
		for _, h := range hs {
			if _, err := os.Stat(filepath.Join(h, CgroupRoot)); err == nil {
				left = append(left, "cgroup "+filepath.Join(h, CgroupRoot))
			}
		}
	}
	if ms, err := mountsUnder(KubeletDir, runDir); err == nil {
		for _, m := range ms {
			left = append(left, "mount "+m)
		}
	}
	for _, d := range c.createdAtStart {
		if _, err := os.Stat(d); err == nil && d != "/run/netns" {
			left = append(left, "directory "+d)
		}
	}
	return left
}
