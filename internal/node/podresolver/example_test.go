package podresolver_test

import (
	"context"
	"net"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/node/peerpidfd"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
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
	)
	idx, err := podindex.New(podindex.Config{
		Pods:        client,
		NodeName:    "node-1", // NODE_NAME
		TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"),
		Handler: podindex.HandlerFuncs{
			Added:   func(id spiffeid.ID) { /* fetch its certificate ahead */ },
			Removed: func(id spiffeid.ID) { /* drop it */ },
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
