package workloadapi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/workloadapi"
)

// Serving SDS and the SPIFFE Workload API on one socket, as cmd/agent does.
// SPIFFE clients (here go-spiffe's) find it with
// SPIFFE_ENDPOINT_SOCKET=unix://<absolute socket path>. A CA in memory
// stands in for istiod.
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
	sdsServer, err := sds.New(sds.Config{Secrets: m, MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16})
	if err != nil {
		panic(err)
	}
	wl, err := workloadapi.New(workloadapi.Config{Secrets: m, MaxStreams: 4096, MaxStreamsPerCaller: 64})
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "workloadapi-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "socket")
	socket, err := udsserver.New(udsserver.Config{
		SocketPath:   path,
		Services:     []func(*grpc.Server){sdsServer.Register, wl.Register},
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

	// A SPIFFE client watches its X.509-SVID and trust bundle; the source
	// is ready once the first certificate is signed.
	waitCtx, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	source, err := gsworkloadapi.NewX509Source(waitCtx,
		gsworkloadapi.WithClientOptions(gsworkloadapi.WithAddr("unix://"+path)))
	if err != nil {
		panic(err)
	}
	defer source.Close()
	svid, err := source.GetX509SVID()
	if err != nil {
		panic(err)
	}
	fmt.Println(svid.ID, len(svid.Certificates) > 0, svid.PrivateKey != nil)
	// Output: spiffe://cluster.local/ns/shop/sa/cart true true
}
