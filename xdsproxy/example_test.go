package xdsproxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/xdsproxy"
)

// How the agent wires the proxy: the xDS root, the token file and the
// workload certificate are shared with the rest of the agent and read
// afresh at every upstream connection.
func ExampleNew() {
	// The agent passes its watched root bundle; any controlplane.RootSource does.
	xdsRoots := controlplane.StaticRoots{Pool: x509.NewCertPool()}
	workloadCert := func() (*tls.Certificate, error) {
		return nil, nil // the secret manager's current certificate
	}
	// The agent listens on MESHAGENT_XDS_SOCKET (./etc/istio/proxy/XDS by default).
	dir, err := os.MkdirTemp("", "xdsproxy-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	p, err := xdsproxy.New(xdsproxy.Config{
		SocketPath: filepath.Join(dir, "XDS"),
		Upstream: controlplane.Config{
			Addr:              "istiod.istio-system.svc:15012",
			ServerName:        "istiod.istio-system.svc",
			Roots:             xdsRoots,
			Token:             credfetcher.File{Path: "./var/run/secrets/tokens/istio-token"},
			Metadata:          map[string]string{"ClusterID": "Kubernetes"},
			ClientCertificate: workloadCert,
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }() // in the agent's errgroup
	defer func() {
		cancel()
		if err := <-done; err != nil {
			log.Fatal(err)
		}
	}()
	// Consulted by /healthz/ready: no client has connected, so no upstream
	// stream has answered yet.
	fmt.Println(errors.Is(p.Ready(), xdsproxy.ErrNotReady))
	// Output: true
}
