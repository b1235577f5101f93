package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshagent/meshagent/internal/localca"
)

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// writeFiles writes the cluster's PKI (a CA, the API server's serving certificate, the
// service-account signing key), the static tokens of the admin and of each component,
// their kubeconfigs, and the containerd, CNI and kubelet configurations.
func (c *Cluster) writeFiles() error {
	ca, err := localca.New(localca.Config{Name: "meshagent-e2e cluster CA"})
	if err != nil {
		return err
	}
	c.caPEM = ca.RootPEM()
	if err := os.WriteFile(c.path("ca.crt"), c.caPEM, 0o644); err != nil {
		return err
	}
	serving, err := ca.ServerTLS(
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		[]net.IP{net.ParseIP(NodeIP), net.ParseIP(ServiceIP), net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return err
	}
	var chain []byte
	for _, der := range serving.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	if err := os.WriteFile(c.path("apiserver.crt"), chain, 0o644); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(serving.PrivateKey)
	if err != nil {
		return err
	}
	if err := writePEM(c.path("apiserver.key"), "PRIVATE KEY", keyDER); err != nil {
		return err
	}
	if err := c.writeServiceAccountKey(); err != nil {
		return err
	}

	users := []struct{ file, user, groups string }{
		{"admin", "e2e-admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
		{"kubelet", "system:node:" + NodeName, "system:nodes"},
	}
	var csv strings.Builder
	for i, u := range users {
		tok := randomToken()
		if u.file == "admin" {
			c.token = tok
		}
		fmt.Fprintf(&csv, "%s,%s,%d,%q\n", tok, u.user, 1000+i, u.groups)
		if err := c.writeKubeconfig(u.file+".kubeconfig", tok); err != nil {
			return err
		}
	}
	if err := os.WriteFile(c.path("tokens.csv"), []byte(csv.String()), 0o600); err != nil {
		return err
	}
	c.rest = &rest.Config{
		Host:            "https://" + net.JoinHostPort(NodeIP, "443"),
		BearerToken:     c.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		Dial:            dialIn(filepath.Join("/run/netns", NetnsName)),
		QPS:             50,
		Burst:           100,
	}
	c.client, err = kubernetes.NewForConfig(c.rest)
	if err != nil {
		return err
	}
	return c.writeRuntimeConfigs()
}

// writeServiceAccountKey writes the key pair that signs and checks
// service-account tokens.
func (c *Cluster) writeServiceAccountKey() error {
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return err
	}
	if err := writePEM(c.path("sa.key"), "PRIVATE KEY", saDER); err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(c.path("sa.pub"), "PUBLIC KEY", pubDER); err != nil {
		return err
	}
	return nil
}

func (c *Cluster) writeKubeconfig(name, token string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://%s:443
    certificate-authority: %s
users:
- name: u
  user:
    token: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: u, namespace: default}
current-context: e2e
`, NodeIP, c.path("ca.crt"), token)
	return os.WriteFile(c.path(name), []byte(kc), 0o600)
}

// writeRuntimeConfigs writes the containerd, CNI and kubelet configurations.
func (c *Cluster) writeRuntimeConfigs() error {
	containerd := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # root cannot raise its OOM score here (CAP_SYS_RESOURCE is withheld): runc would
  # fail every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, c.path("containerd-root"), filepath.Join(runDir, "containerd"), c.containerdSock(), filepath.Join(runDir, "containerd.ttrpc.sock"), PauseImage, c.path("cni"))
	if err := os.WriteFile(c.path("containerd.toml"), []byte(containerd), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(c.path("cni"), 0o755); err != nil {
		return err
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "e2e",
  "plugins": [{
    "type": "bridge",
    "bridge": "e2e0",
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": %q
    }
  }, {"type": "loopback"}]
}
`, PodCIDR, c.path("cni-ipam"))
	if err := os.WriteFile(filepath.Join(c.path("cni"), "10-e2e.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	return c.writeKubeletConfig()
}

// writeKubeletConfig writes the kubelet's configuration file.
func (c *Cluster) writeKubeletConfig() error {
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# No systemd and cgroup v1 here: the cgroupfs driver, and v1 explicitly allowed.
cgroupDriver: cgroupfs
failCgroupV1: false
# Pods live under /meshagent-e2e/kubepods: the kubelet removes unknown pod cgroups only
# there, never the /kubepods trees other tests on this machine fake.
cgroupRoot: %s
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
authorization:
  mode: Webhook
clusterDomain: cluster.local
resolvConf: ""
# Images were imported, not pulled: never collect them; and a busy shared disk is no
# reason to evict the test's pods.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%%"
  imagefs.available: "0%%"
  nodefs.inodesFree: "0%%"
serializeImagePulls: false
staticPodPath: ""
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
`, CgroupRoot, c.containerdSock(), NodeIP)
	return os.WriteFile(c.path("kubelet.yaml"), []byte(kubelet), 0o644)
}

func (c *Cluster) containerdSock() string { return filepath.Join(runDir, "containerd.sock") }

func (c *Cluster) startEtcd(ctx context.Context) error {
	p, err := c.start("etcd", c.tools["etcd"],
		"--data-dir", c.path("etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		"--listen-metrics-urls", "http://127.0.0.1:2381",
		"--quota-backend-bytes", "1073741824",
		"--unsafe-no-fsync")
	if err != nil {
		return err
	}
	return c.poll(ctx, p, func() error {
		var conn net.Conn
		err := inNetnsPath(c.netnsPath, func() error {
			var err error
			conn, err = net.DialTimeout("tcp", "127.0.0.1:2379", time.Second)
			return err
		})
		if err == nil {
			conn.Close()
		}
		return err
	})
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p, err := c.start("kube-apiserver", c.tools["kube-apiserver"],
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0",
		"--secure-port=443",
		"--advertise-address="+NodeIP,
		"--endpoint-reconciler-type=none",
		"--tls-cert-file="+c.path("apiserver.crt"),
		"--tls-private-key-file="+c.path("apiserver.key"),
		"--token-auth-file="+c.path("tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--service-cluster-ip-range="+ServiceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+c.path("sa.pub"),
		"--service-account-signing-key-file="+c.path("sa.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	return c.httpsReady(ctx, "https://"+NodeIP+":443/readyz", p)
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	p, err := c.start("kube-controller-manager", c.tools["kube-controller-manager"],
		"--kubeconfig="+c.path("controller-manager.kubeconfig"),
		"--authentication-kubeconfig="+c.path("controller-manager.kubeconfig"),
		"--authorization-kubeconfig="+c.path("controller-manager.kubeconfig"),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.path("sa.key"),
		"--root-ca-file="+c.path("ca.crt"),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--controllers=*,-node-ipam-controller",
	)
	if err != nil {
		return err
	}
	// Ready once the root CA is published: pods' API credentials need it.
	return c.poll(ctx, p, func() error {
		_, err := c.client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
}

func (c *Cluster) startScheduler(ctx context.Context) error {
	p, err := c.start("kube-scheduler", c.tools["kube-scheduler"],
		"--kubeconfig="+c.path("scheduler.kubeconfig"),
		"--authentication-kubeconfig="+c.path("scheduler.kubeconfig"),
		"--authorization-kubeconfig="+c.path("scheduler.kubeconfig"),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
	)
	if err != nil {
		return err
	}
	// Nothing to wait for: pods stay Pending until it runs.
	time.Sleep(100 * time.Millisecond)
	if p.exited() {
		return fmt.Errorf("kube-scheduler exited: %v", p.err)
	}
	return nil
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	p, err := c.start("containerd", c.tools["containerd"], "--config", c.path("containerd.toml"))
	if err != nil {
		return err
	}
	return c.poll(ctx, p, func() error {
		return run(c.tools["ctr"], "--address", c.containerdSock(), "version")
	})
}

func (c *Cluster) importImages(ctx context.Context) error {
	for _, img := range c.cfg.Images {
		if err := c.ImportImage(img); err != nil {
			return err
		}
	}
	return nil
}

// ImportImage loads an image archive into the kubelet's containerd namespace.
func (c *Cluster) ImportImage(archive string) error {
	return run(c.tools["ctr"], "--address", c.containerdSock(), "-n", "k8s.io", "images", "import", "--no-unpack=false", archive)
}

// StartKubelet starts the kubelet (again, after StopKubelet).
func (c *Cluster) StartKubelet(ctx context.Context) error {
	_, err := c.start("kubelet", c.tools["kubelet"],
		"--config="+c.path("kubelet.yaml"),
		"--kubeconfig="+c.path("kubelet.kubeconfig"),
		"--hostname-override="+NodeName,
		"--node-ip="+NodeIP,
		"--v=2",
	)
	return err
}

// StopKubelet stops the kubelet; pods keep running.
func (c *Cluster) StopKubelet() { c.procs["kubelet"].stop(10 * time.Second) }

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	return c.poll(ctx, c.procs["kubelet"], func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready", NodeName)
	})
}

// WaitNodeReady waits until the node reports Ready (after a kubelet restart).
func (c *Cluster) WaitNodeReady(ctx context.Context) error { return c.waitNodeReady(ctx) }
