package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/programtb"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// The identity and credentials every benchmark agent runs with.
const (
	benchToken          = "meshbench-token"
	benchTrustDomain    = "cluster.local"
	benchNamespace      = "bench"
	benchServiceAccount = "meshbench"
)

// fixture is the test CA and control plane the agents talk to, on loopback.
type fixture struct {
	tb     *programtb.TB
	ca     *istioca.Server
	xds    *xdsserver.Server
	issued issueLog
}

// issueLog records when the CA signed each certificate: the test CA asks its
// clock once per issuance, just before signing.
type issueLog struct {
	mu    sync.Mutex
	times []time.Time
}

func (l *issueLog) now() time.Time {
	t := time.Now()
	l.mu.Lock()
	l.times = append(l.times, t)
	l.mu.Unlock()
	return t
}

// latestBefore is the last issuance at or before t.
func (l *issueLog) latestBefore(t time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.times) - 1; i >= 0; i-- {
		if !l.times[i].After(t) {
			return l.times[i], true
		}
	}
	return time.Time{}, false
}

// startFixture starts the test CA and control plane. Close stops them.
func startFixture() (*fixture, error) {
	f := &fixture{tb: programtb.New("meshbench")}
	err := programtb.Guard(func() {
		f.ca = istioca.Start(f.tb, istioca.Config{
			TrustDomain: benchTrustDomain,
			Tokens:      map[string]istioca.ServiceAccount{benchToken: {Namespace: benchNamespace, Name: benchServiceAccount}},
			Now:         f.issued.now,
		})
		f.xds = xdsserver.Start(f.tb, xdsserver.Config{
			CA:          f.ca.CA(),
			ServerNames: []string{istioca.DefaultServerName},
			Tokens:      []string{benchToken},
		})
	})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("starting test servers: %w", err)
	}
	return f, nil
}

// Close stops the servers.
func (f *fixture) Close() { f.tb.Close() }

// agentConfig is the configuration of an agent using this fixture.
func (f *fixture) agentConfig(binary string, args []string, keyType string, ttl time.Duration) agentConfig {
	return agentConfig{
		Binary:         binary,
		Args:           args,
		KeyType:        keyType,
		SecretTTL:      ttl,
		CAAddr:         f.ca.Addr(),
		ServerName:     istioca.DefaultServerName,
		XDSAddr:        f.xds.Addr(),
		RootPEM:        f.ca.RootPEM(),
		Token:          benchToken,
		TrustDomain:    benchTrustDomain,
		Namespace:      benchNamespace,
		ServiceAccount: benchServiceAccount,
	}
}

// bigNode is the node ID the large ADS response is published for.
const bigNode = "meshbench-big"

// publishBig publishes, for bigNode, generic secrets of chunk bytes each
// adding up to total bytes of payload: one ADS response of about total bytes.
func (f *fixture) publishBig(version string, total, chunk int) error {
	rng := rand.NewChaCha8([32]byte{1})
	var res []types.Resource
	for i := 0; total > 0; i++ {
		n := min(chunk, total)
		total -= n
		b := make([]byte, n)
		_, _ = rng.Read(b)
		res = append(res, &tlsv3.Secret{
			Name: fmt.Sprintf("bench-%04d", i),
			Type: &tlsv3.Secret_GenericSecret{GenericSecret: &tlsv3.GenericSecret{
				Secret: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}},
			}},
		})
	}
	return f.xds.SetResources(bigNode, version, map[resource.Type][]types.Resource{resource.SecretType: res})
}

// bigRequest asks for every secret published for bigNode.
func bigRequest() *discovery.DiscoveryRequest {
	return &discovery.DiscoveryRequest{Node: &corev3.Node{Id: bigNode}, TypeUrl: resource.SecretType}
}

// staticToken is a bearer token that never changes.
type staticToken string

func (t staticToken) Token(context.Context) (string, error) { return string(t), nil }

// dialControlPlane connects straight to the control plane, over TLS verified
// against the CA root and with the bearer token, as the agent's proxy does.
func (f *fixture) dialControlPlane() (*grpc.ClientConn, error) {
	conn, err := controlplane.Dial(controlplane.Config{
		Addr:        f.xds.Addr(),
		ServerName:  istioca.DefaultServerName,
		Roots:       controlplane.StaticRoots{Pool: f.ca.Roots()},
		Token:       staticToken(benchToken),
		DialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxADSMessage))},
	})
	if err != nil {
		return nil, fmt.Errorf("dialing control plane: %w", err)
	}
	return conn, nil
}
