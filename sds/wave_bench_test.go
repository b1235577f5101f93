package sds

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// BenchmarkRenewalWave1000 is a node's renewal wave: 1,000 identities,
// each held by one pod's SDS stream (one connection per pod, the socket
// server resolving each connection to its own identity), all issued at the
// same moment and so all due together. The CA is the test Istio CA over
// gRPC/TLS on loopback, reached by the Istio CA client with a bearer token
// per identity, and the CSRs go through the secret manager's budget
// (MESHAGENT_CA_MAX_CONCURRENT_CSRS's default, 8). Each op steps the clock to the
// renewal time and waits until every stream has its new certificate. It
// reports:
//
//	wave-ms            from the clock step to the last stream holding its
//	                   new certificate
//	csrs-in-flight-max the most CSRs the CA held at once during the wave
//	                   (arrival to answer), against the budget
//	csr-budget         the budget
//	cpu-s              CPU seconds of the process during the wave (user and
//	                   system): the agent's side (keys, CSRs, TLS, checks,
//	                   1,000 pushes) together with the test CA's signing and
//	                   the 1,000 clients' decoding and ACKs
//	ca-answer-ms-p50   the median CSR's time at the CA, arrival to answer
//
// Run: go test -run '^$' -bench RenewalWave -benchtime 3x ./sds/
func BenchmarkRenewalWave1000(b *testing.B) {
	identities := waveIdentities
	const ttl = time.Hour
	budget := 8 // MESHAGENT_CA_MAX_CONCURRENT_CSRS's default

	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	tokens := map[string]istioca.ServiceAccount{}
	// A token for more identities than there are pods: the socket server
	// may resolve a connection the gRPC client opens and drops.
	for i := range 4 * identities {
		tokens[waveToken(i)] = istioca.ServiceAccount{Namespace: "wave", Name: fmt.Sprintf("sa-%d", i)}
	}
	ca := istioca.Start(b, istioca.Config{Tokens: tokens, Now: clk.Now})
	client, err := istio.New(istio.Config{Transport: controlplane.Config{
		Addr: ca.Addr(), ServerName: ca.ServerName(),
		Roots: controlplane.StaticRoots{Pool: ca.Roots()}, Token: waveTokens{},
	}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Close() })
	roots, err := secret.NewRoots(ca.RootPEM(), "istio-ca")
	if err != nil {
		b.Fatal(err)
	}
	mgr, err := secretmanager.New(secretmanager.Config{
		// No own identity: the manager serves the callers' (node mode).
		CA: tokenPerIdentity{client}, Roots: roots, TTL: ttl, Logger: waveLogger,
		MaxConcurrentCSRs: budget,
		Clock:             clk, Rand: func() float64 { return 0.5 },
		GraceRatio: 0.5, IdleGrace: time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{Secrets: mgr, MaxStreams: 2 * identities, Logger: zap.NewNop(), MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16})
	if err != nil {
		b.Fatal(err)
	}
	socket := filepath.Join(shortDir(b), "socket")
	uds, err := socketServer(srv, udsserver.Config{SocketPath: socket, Resolver: &identityPerConnection{}, Logger: zap.NewNop(), MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = mgr.Run(ctx); done <- struct{}{} }()
	go func() { _ = uds.Run(ctx); done <- struct{}{} }()
	b.Cleanup(func() { cancel(); <-done; <-done })

	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	streams := make([]*sdsclient.Stream, identities)
	serials := make([]string, identities)
	for i := range streams {
		c, err := sdsclient.Dial(wctx, socket)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		if streams[i], err = c.Stream(wctx, sdsclient.StreamConfig{Names: []string{"default"}}); err != nil {
			b.Fatal(err)
		}
	}
	// Every stream's first certificate: all issued at the same fake time,
	// so all due at the same time.
	seen := map[string]bool{}
	for i, s := range streams {
		var uri string
		serials[i], uri = waveCert(b, wctx, s, "")
		seen[uri] = true
	}
	if len(seen) != identities {
		b.Fatalf("the %d streams hold %d identities, want one each", identities, len(seen))
	}

	var waveMs, cpuS, caMs []float64
	peak := 0
	for b.Loop() {
		before := len(ca.CSRs())
		cpu0 := processCPU()
		start := time.Now()
		testwait.Step(b, clk, ttl/2)
		for i, s := range streams {
			serials[i], _ = waveCert(b, wctx, s, serials[i])
		}
		waveMs = append(waveMs, float64(time.Since(start).Microseconds())/1000)
		cpuS = append(cpuS, (processCPU() - cpu0).Seconds())
		csrs := ca.CSRs()[before:]
		if len(csrs) < identities {
			b.Fatalf("%d CSRs in the wave, want at least %d", len(csrs), identities)
		}
		peak = max(peak, inFlightPeak(csrs))
		for _, c := range csrs {
			caMs = append(caMs, float64(c.Answered.Sub(c.At).Microseconds())/1000)
		}
		b.Logf("wave: %.0f ms, %d CSRs, first arrival %.1f ms and last answer %.1f ms after the step, CPU %.2f s",
			waveMs[len(waveMs)-1], len(csrs), float64(csrs[0].At.Sub(start).Microseconds())/1000,
			float64(csrs[len(csrs)-1].Answered.Sub(start).Microseconds())/1000, cpuS[len(cpuS)-1])
	}
	b.ReportMetric(median(waveMs), "wave-ms")
	b.ReportMetric(float64(peak), "csrs-in-flight-max")
	b.ReportMetric(float64(budget), "csr-budget")
	b.ReportMetric(median(cpuS), "cpu-s")
	b.ReportMetric(median(caMs), "ca-answer-ms-p50")
	if peak > budget {
		b.Errorf("%d CSRs in flight at the CA, budget %d", peak, budget)
	}
}

// waveCert waits for the stream's next certificate, whose serial must
// differ from prev, and returns its serial and URI SAN.
func waveCert(b *testing.B, ctx context.Context, s *sdsclient.Stream, prev string) (serial, uri string) {
	b.Helper()
	for {
		r, err := s.Next(ctx)
		if err != nil {
			b.Fatalf("waiting for a certificate: %v", err)
		}
		chain, _, ok := r.Cert("default")
		if !ok {
			continue
		}
		certs, err := pki.ParseCertificates(chain)
		if err != nil || len(certs) == 0 {
			b.Fatalf("certificate chain: %v", err)
		}
		if serial := certs[0].SerialNumber.String(); serial != prev {
			if len(certs[0].URIs) == 1 {
				uri = certs[0].URIs[0].String()
			}
			return serial, uri
		}
	}
}

// inFlightPeak is the most calls among csrs that were between arrival and
// answer at once.
func inFlightPeak(csrs []istioca.CSRRecord) int {
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, c := range csrs {
		edges = append(edges, edge{c.At, 1})
		if !c.Answered.IsZero() {
			edges = append(edges, edge{c.Answered, -1})
		}
	}
	// An answer at the same instant as an arrival ends first.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d
	})
	n, peak := 0, 0
	for _, e := range edges {
		n += e.d
		peak = max(peak, n)
	}
	return peak
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func waveIdentity(i int) pki.Identity {
	return pki.SPIFFEIdentity("cluster.local", "wave", fmt.Sprintf("sa-%d", i))
}

func waveToken(i int) string { return fmt.Sprintf("token-%d", i) }

// identityPerConnection resolves each new connection to the next identity,
// as a node's pods each connect with their own.
type identityPerConnection struct{ n atomic.Int64 }

func (r *identityPerConnection) Resolve(context.Context, caller.Cred) (caller.Info, error) {
	i := int(r.n.Add(1) - 1)
	return caller.Info{Identity: waveIdentity(i), Pod: fmt.Sprintf("wave/pod-%d", i), PodUID: fmt.Sprintf("uid-%d", i)}, nil
}

// waveIdentityKey carries the identity a Sign is for to waveTokens.
type waveIdentityKey struct{}

// tokenPerIdentity signs each identity with that identity's own bearer
// token (the test CA issues the token's identity), standing in for a node
// agent's impersonation, which the test CA grants only with a Kubernetes
// API server.
type tokenPerIdentity struct{ *istio.Client }

func (c tokenPerIdentity) Sign(ctx context.Context, csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	return c.Client.Sign(context.WithValue(ctx, waveIdentityKey{}, id), csr, id, ttl)
}

// waveTokens is the bearer token of the identity in the call's context.
type waveTokens struct{}

func (waveTokens) Token(ctx context.Context) (string, error) {
	id, _ := ctx.Value(waveIdentityKey{}).(pki.Identity)
	var i int
	if _, err := fmt.Sscanf(id.SPIFFEID, "spiffe://cluster.local/ns/wave/sa/sa-%d", &i); err != nil {
		return "", fmt.Errorf("no wave identity in the call: %q", id.SPIFFEID)
	}
	return waveToken(i), nil
}

var waveIdentities = 1000

var waveLogger = zap.NewNop()
