package sds_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// Serving a secret manager's secrets on a Unix socket, as cmd/agent does on
// pilot-agent's path (./var/run/secrets/workload-spiffe-uds/socket): the
// manager and the socket server run until ctx ends, and Envoy (here the
// test client) asks for "default" and "ROOTCA". A CA in memory stands in
// for istiod.
func Example() {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		panic(err)
	}
	signer, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		panic(err)
	}
	roots, err := secret.NewRoots(ca.RootPEM(), "dev-ca")
	if err != nil {
		panic(err)
	}
	m, err := secretmanager.New(secretmanager.Config{
		Identity: pki.SPIFFEIdentity("cluster.local", "shop", "cart"),
		CA:       signer,
		Roots:    roots,
		TTL:      24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute,
	})
	if err != nil {
		panic(err)
	}
	srv, err := sds.New(sds.Config{
		Secrets:    m, // any Secret/Watch pair will do,
		MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16,
	})
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "sds-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "socket")
	socket, err := udsserver.New(udsserver.Config{
		SocketPath:   path,
		Services:     []func(*grpc.Server){srv.Register},
		MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute,
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var g errgroup.Group
	g.Go(func() error { return m.Run(ctx) })
	g.Go(func() error { return socket.Run(ctx) })
	defer func() {
		cancel()
		if err := g.Wait(); err != nil {
			panic(err)
		}
	}()

	// What Envoy does: a request for both names, answered once the first
	// certificate is signed.
	fetchCtx, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	envoy, err := sdsclient.Dial(fetchCtx, path)
	if err != nil {
		panic(err)
	}
	defer envoy.Close()
	resp, err := envoy.Fetch(fetchCtx, "default", "ROOTCA")
	if err != nil {
		panic(err)
	}
	chainPEM, _, _ := resp.Cert("default")
	chain, err := pki.ParseCertificates(chainPEM)
	if err != nil {
		panic(err)
	}
	_, hasRoot := resp.TrustedCA("ROOTCA")
	fmt.Println(chain[0].URIs[0], hasRoot)
	// Output: spiffe://cluster.local/ns/shop/sa/cart true
}
