package podresolver_test

import (
	"context"
	"net"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/node/peerpidfd"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// How node mode fits together: the index watches the node's pods, the
// resolver maps each connection to one of them, and the socket server takes
// the connecting process's pidfd when it accepts, before anything else.
func Example() {
	var (
		ctx    = context.Background()
		client *kubeclient.Client // from the agent's kubeconfig or in-cluster config
		conn   *net.UnixConn      // a connection the socket server accepted
		cred   caller.Cred        // its SO_PEERCRED
		scheme pki.Scheme         // pki.IstioScheme(TRUST_DOMAIN), or Linkerd's
	)
	idx, err := podindex.New(podindex.Config{
		Pods:     client,
		NodeName: "node-1", // NODE_NAME
		Scheme:   scheme,
		Handler: podindex.HandlerFuncs{
			Added:   func(id pki.Identity) { /* fetch its certificate ahead */ },
			Removed: func(id pki.Identity) { /* drop it */ },
		},
	})
	if err != nil {
		return
	}
	go idx.Run(ctx) // in the agent's errgroup

	r, err := podresolver.New(podresolver.Config{Pods: idx})
	if err != nil {
		return
	}
	pidfd, err := peerpidfd.FromConn(conn) // at accept; closed with the connection
	if err != nil {
		return
	}
	defer unix.Close(pidfd)
	info, err := r.Resolve(peerpidfd.NewContext(ctx, pidfd), cred)
	if err != nil {
		return // PermissionDenied with err's text
	}
	_ = caller.NewContext(ctx, info) // what the RPC handlers see
}
