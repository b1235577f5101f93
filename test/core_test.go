package test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

const coreToken = "token-ns1-sa1"

var coreSA = istioca.ServiceAccount{Namespace: "ns1", Name: "sa1"}

// coreAgent is the certificate half of the agent as cmd/agent wires it: the
// Istio CA client over TLS to a test CA, the secret manager on a fake clock,
// and the SDS server on a Unix socket.
type coreAgent struct {
	t      testing.TB
	dirs   []string
	socket string
	clock  *clocktesting.FakeClock
	ca     *istioca.Server
	id     pki.Identity
	mgr    *secretmanager.Manager
	roots  *secretmanager.Roots
	reg    *prometheus.Registry
	logs   *observer.ObservedLogs
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type coreOpts struct {
	ttl        time.Duration
	holdAgent  bool // start the manager only when startManager is called
	realClock  bool // benchmarks: no fake clock
	quietLogs  bool
	sharedCA   *istioca.Server
	caClientFn func(*istio.Config)
}

func coreTempDir(t testing.TB) string {
	t.Helper()
	// Short, so the socket path fits a Unix socket address.
	dir, err := os.MkdirTemp("", "core")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func newCoreAgent(t testing.TB, o coreOpts) *coreAgent {
	t.Helper()
	if o.ttl == 0 {
		o.ttl = time.Hour
	}
	a := &coreAgent{t: t, reg: prometheus.NewRegistry()}
	a.clock = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	now := a.clock.Now
	if o.realClock {
		now = time.Now
	}
	a.ca = o.sharedCA
	if a.ca == nil {
		a.ca = istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{coreToken: coreSA}, Now: now})
	}
	a.id = a.ca.Identity(coreSA)

	run, tokens := coreTempDir(t), coreTempDir(t)
	a.dirs = []string{run, tokens}
	a.socket = filepath.Join(run, "workload-spiffe-uds", "socket")
	tokenPath := filepath.Join(tokens, "istio-token")
	if err := os.WriteFile(tokenPath, []byte(coreToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	var logger *zap.Logger
	if o.quietLogs {
		logger = zap.NewNop()
	} else {
		core, logs := observer.New(zapcore.InfoLevel)
		logger, a.logs = zap.New(core), logs
	}
	roots, err := secretmanager.NewRoots(a.ca.RootPEM(), "ca-root")
	if err != nil {
		t.Fatal(err)
	}
	a.roots = roots
	icfg := istio.Config{
		Transport: caclient.TransportConfig{
			Addr:       a.ca.Addr(),
			ServerName: a.ca.ServerName(),
			Roots:      roots,
			Token:      credfetcher.File{Path: tokenPath},
			Metadata:   map[string]string{"ClusterID": "Kubernetes"},
		},
		Logger:     logger,
		Registerer: a.reg,
	}
	if o.caClientFn != nil {
		o.caClientFn(&icfg)
	}
	client, err := istio.New(icfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	mcfg := secretmanager.Config{
		Identity:   a.id,
		CA:         client,
		Roots:      roots,
		TTL:        o.ttl,
		Clock:      a.clock,
		Rand:       func() float64 { return 0.5 },
		Logger:     logger,
		Registerer: a.reg,
	}
	if o.realClock {
		mcfg.Clock, mcfg.Rand = nil, nil
	}
	a.mgr, err = secretmanager.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sds.New(sds.Config{Secrets: a.mgr, Logger: logger, Registerer: a.reg})
	if err != nil {
		t.Fatal(err)
	}
	socket, err := udsserver.New(udsserver.Config{SocketPath: a.socket, Services: []func(*grpc.Server){srv.Register}, Logger: logger, Registerer: a.reg})
	if err != nil {
		t.Fatal(err)
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.run("sds", socket.Run)
	if !o.holdAgent {
		a.startManager()
	}
	t.Cleanup(a.stop)
	return a
}

func (a *coreAgent) run(name string, fn func(context.Context) error) {
	a.wg.Go(func() {
		if err := fn(a.ctx); err != nil {
			a.t.Errorf("%s: Run returned %v", name, err)
		}
	})
}

func (a *coreAgent) startManager() { a.run("secretmanager", a.mgr.Run) }

func (a *coreAgent) stop() {
	a.cancel()
	a.wg.Wait()
}

func (a *coreAgent) dial() *sdsclient.Client {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, a.socket)
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (a *coreAgent) stream(c *sdsclient.Client, names ...string) *sdsclient.Stream {
	a.t.Helper()
	s, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: names})
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(s.Close)
	return s
}

func coreNext(t testing.TB, s *sdsclient.Stream) *sdsclient.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("waiting for an SDS response: %v", err)
	}
	return r
}

// noResponse checks that nothing arrived on s (a pushed response would have
// arrived by the time the manager set its next timer).
func noResponse(t testing.TB, s *sdsclient.Stream, what string) {
	t.Helper()
	select {
	case r := <-s.Responses():
		t.Fatalf("unexpected SDS response %v: %s", r.Names, what)
	default:
	}
}

// waitTimer waits until the manager waits on the fake clock.
func (a *coreAgent) waitTimer() {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !a.clock.HasWaiters() {
		if time.Now().After(deadline) {
			a.t.Fatal("the secret manager set no timer")
		}
		time.Sleep(time.Millisecond)
	}
}

func (a *coreAgent) step(d time.Duration) {
	a.t.Helper()
	a.waitTimer()
	a.clock.Step(d)
}

// checkDefault checks a served default secret: the SPIFFE SAN of the caller,
// a chain that verifies to the CA root now, and a key that matches. It
// returns the leaf.
func (a *coreAgent) checkDefault(r *sdsclient.Response) (leafPEM []byte, notAfter time.Time) {
	a.t.Helper()
	chainPEM, keyPEM, ok := r.Cert("default")
	if !ok {
		a.t.Fatalf("no TlsCertificate named default in %v", r.Names)
	}
	chain, err := pki.ParseCertificates(chainPEM)
	if err != nil {
		a.t.Fatal(err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), a.id, a.ca.Roots(), a.clock.Now()); err != nil {
		a.t.Fatalf("served certificate: %v", err)
	}
	if len(chain[0].URIs) != 1 || chain[0].URIs[0].String() != "spiffe://cluster.local/ns/ns1/sa/sa1" {
		a.t.Fatalf("SAN %v", chain[0].URIs)
	}
	return chain[0].Raw, chain[0].NotAfter
}

func TestCoreDefaultAndROOTCA(t *testing.T) {
	a := newCoreAgent(t, coreOpts{})
	c := a.dial()
	r := coreNext(t, a.stream(c, "default"))
	a.checkDefault(r)
	root := coreNext(t, a.stream(c, "ROOTCA"))
	trusted, ok := root.TrustedCA("ROOTCA")
	if !ok || !bytes.Equal(trusted, a.ca.RootPEM()) {
		t.Fatal("ROOTCA does not carry the CA root")
	}
	if a.ca.Requests() != 1 {
		t.Errorf("%d CA requests, want 1", a.ca.Requests())
	}
	if got := a.ca.LastRequest().GetValidityDuration(); got != 3600 {
		t.Errorf("validity_duration %d, want the 1h TTL", got)
	}
	if md := a.ca.LastMetadata(); len(md.Get("clusterid")) != 1 || md.Get("clusterid")[0] != "Kubernetes" {
		t.Errorf("ClusterID metadata %v", md)
	}
	if toks := a.ca.Tokens(); len(toks) != 1 || toks[0] != "Bearer "+coreToken {
		t.Errorf("tokens at the CA: %v", toks)
	}
	if err := a.mgr.Ready(); err != nil {
		t.Errorf("not ready: %v", err)
	}
}

func TestCoreRotationOnSameStream(t *testing.T) {
	a := newCoreAgent(t, coreOpts{ttl: 30 * time.Second})
	s := a.stream(a.dial(), "default")
	oldLeaf, oldExpiry := a.checkDefault(coreNext(t, s))

	a.step(14 * time.Second)
	a.waitTimer()
	noResponse(t, s, "before renew_at")

	a.step(time.Second) // 15 s of a 30 s life
	newLeaf, _ := a.checkDefault(coreNext(t, s))
	if bytes.Equal(oldLeaf, newLeaf) {
		t.Fatal("the push repeats the old certificate")
	}
	if !a.clock.Now().Before(oldExpiry) {
		t.Fatal("the new certificate arrived after the old one expired")
	}
	if a.ca.Requests() != 2 {
		t.Errorf("%d CA requests, want 2", a.ca.Requests())
	}
}

func TestCoreCAOutage(t *testing.T) {
	a := newCoreAgent(t, coreOpts{ttl: time.Minute})
	c := a.dial()
	s := a.stream(c, "default")
	oldLeaf, oldExpiry := a.checkDefault(coreNext(t, s))

	a.ca.Stop()
	a.step(30 * time.Second) // renew_at, with the CA down
	start := a.clock.Now()
	for a.clock.Since(start) < 20*time.Second {
		a.step(time.Second)
		if err := a.mgr.Ready(); err != nil {
			t.Fatalf("not ready during the outage: %v", err)
		}
	}
	a.waitTimer()
	noResponse(t, s, "during the outage")
	// A new Envoy stream still gets the held certificate.
	during, _ := a.checkDefault(coreNext(t, a.stream(c, "default")))
	if !bytes.Equal(during, oldLeaf) {
		t.Fatal("a different certificate was served during the outage")
	}
	if n := a.logs.FilterMessage("certificate request failed").Len(); n < 4 {
		t.Fatalf("%d failed requests logged in 20 s of outage, want at least 4", n)
	}

	a.ca.Restart(t)
	for range 60 {
		a.step(time.Second)
		select {
		case r := <-s.Responses():
			newLeaf, _ := a.checkDefault(r)
			if bytes.Equal(newLeaf, oldLeaf) || !a.clock.Now().Before(oldExpiry) {
				t.Fatal("renewal after the outage did not replace the certificate in time")
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("renewal did not resume after the CA came back")
}

func TestCoreBadAnswersRejected(t *testing.T) {
	tests := []struct {
		mode   istioca.Mode
		reason string
	}{
		{istioca.ModeWrongSAN, "identity_mismatch"},
		{istioca.ModeForeignChain, "untrusted_chain"},
		{istioca.ModeExpired, "not_valid_now"},
		{istioca.ModeWrongKey, "key_mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			a := newCoreAgent(t, coreOpts{})
			s := a.stream(a.dial(), "default")
			oldLeaf, _ := a.checkDefault(coreNext(t, s))

			a.ca.SetMode(tt.mode)
			a.step(30 * time.Minute)
			a.waitTimer()
			noResponse(t, s, "a bad answer was pushed")
			logs := a.logs.FilterMessage("CA answer rejected").All()
			if len(logs) != 1 || logs[0].ContextMap()["reason"] != tt.reason {
				t.Fatalf("rejection logs %v, want one with reason %s", logs, tt.reason)
			}
			if got := coreCounter(t, a.reg, "meshagent_ca_answers_rejected_total", "reason", tt.reason); got != 1 {
				t.Errorf("meshagent_ca_answers_rejected_total{reason=%q} = %v, want 1", tt.reason, got)
			}
			if err := a.mgr.Ready(); err != nil {
				t.Fatalf("the held certificate was dropped: %v", err)
			}

			a.ca.SetMode(istioca.ModeOK)
			a.step(time.Second)
			newLeaf, _ := a.checkDefault(coreNext(t, s))
			if bytes.Equal(newLeaf, oldLeaf) {
				t.Fatal("no new certificate after the CA answered well again")
			}
		})
	}
}

func coreCounter(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestCoreManyStreamsOneCSR(t *testing.T) {
	a := newCoreAgent(t, coreOpts{holdAgent: true})
	// 100 streams on 10 connections: one caller holds at most
	// MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER (32) connections.
	const n, conns = 100, 10
	clients := make([]*sdsclient.Client, conns)
	for i := range clients {
		clients[i] = a.dial()
	}
	streams := make([]*sdsclient.Stream, n)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() { streams[i] = a.stream(clients[i%conns], "default", "ROOTCA") })
	}
	wg.Wait()
	// No certificate yet: each stream gets ROOTCA alone, without waiting
	// for default (SPEC 13: every name resolves on its own).
	for _, s := range streams {
		if r := coreNext(t, s); len(r.Names) != 1 || r.Names[0] != "ROOTCA" {
			t.Fatalf("first response holds %v, want ROOTCA alone", r.Names)
		}
	}
	a.startManager()
	var first []byte
	for _, s := range streams {
		leaf, _ := a.checkDefault(coreNext(t, s))
		if first == nil {
			first = leaf
		} else if !bytes.Equal(first, leaf) {
			t.Fatal("streams got different certificates")
		}
	}
	if got := a.ca.Requests(); got != 1 {
		t.Fatalf("%d CSRs for %d streams, want 1", got, n)
	}
}

// With the CA down and the workload certificate expired, a stream holding
// default and ROOTCA still gets every root change; default is not pushed
// again until a new certificate exists.
func TestCoreRootChangeWhileCertificateExpired(t *testing.T) {
	a := newCoreAgent(t, coreOpts{ttl: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.mgr.Secret(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	s := a.stream(a.dial(), "default", "ROOTCA")
	r := coreNext(t, s)
	_, notAfter := a.checkDefault(r)
	a.ca.SetMode(istioca.ModeError)
	a.ca.SetError(codes.Unavailable)
	for a.clock.Now().Before(notAfter) {
		a.step(10 * time.Minute)
	}
	a.waitTimer()
	if err := a.mgr.Live(); err == nil {
		t.Fatal("live with an expired certificate")
	}
	next, err := localca.New(localca.Config{Name: "next root"})
	if err != nil {
		t.Fatal(err)
	}
	bundle := append(append([]byte{}, a.ca.RootPEM()...), next.RootPEM()...)
	if err := a.roots.Set(bundle, "ca-root"); err != nil {
		t.Fatal(err)
	}
	r = coreNext(t, s)
	if got, ok := r.TrustedCA("ROOTCA"); !ok || !bytes.Equal(got, bundle) {
		t.Fatalf("response %v does not carry the new bundle", r.Names)
	}
	if _, _, ok := r.Cert("default"); ok {
		t.Fatal("the expired certificate was pushed again")
	}
	// The name that became unavailable was counted (and logged) once.
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var unavailable float64
	for _, mf := range mfs {
		if mf.GetName() == "meshagent_sds_resources_unavailable_total" {
			unavailable = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if unavailable != 1 {
		t.Errorf("meshagent_sds_resources_unavailable_total = %v, want 1", unavailable)
	}
	if n := a.logs.FilterMessage("resource not available yet; the others are served and it is pushed once it is").Len(); n != 1 {
		t.Errorf("%d logs of the unavailable name, want 1", n)
	}
}

func TestCoreUnknownResource(t *testing.T) {
	a := newCoreAgent(t, coreOpts{})
	s := a.stream(a.dial(), "default", "no-such-secret")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Next(ctx); !errors.Is(err, sdsclient.ErrEnded) {
		t.Fatalf("stream not ended: %v", err)
	}
	if st, _ := status.FromError(s.Err()); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "no-such-secret") {
		t.Fatalf("stream ended with %v, want InvalidArgument naming the resource", s.Err())
	}
}

// TestCoreNoPrivateKeyOnDisk runs a rotation and then looks for the served
// keys in every file under the agent's directories and the working
// directory.
func TestCoreNoPrivateKeyOnDisk(t *testing.T) {
	start := time.Now()
	a := newCoreAgent(t, coreOpts{ttl: 30 * time.Second})
	s := a.stream(a.dial(), "default")
	var keys [][]byte
	r := coreNext(t, s)
	_, k1, _ := r.Cert("default")
	a.step(15 * time.Second)
	r = coreNext(t, s)
	_, k2, _ := r.Cert("default")
	for _, k := range [][]byte{k1, k2} {
		// The base64 body of the key, without the PEM armour.
		lines := bytes.Split(bytes.TrimSpace(k), []byte("\n"))
		keys = append(keys, bytes.Join(lines[1:len(lines)-1], nil))
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range append(a.dirs, wd) {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !d.Type().IsRegular() {
				return err
			}
			info, err := d.Info()
			if err != nil || (dir == wd && info.ModTime().Before(start)) {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			flat := bytes.ReplaceAll(b, []byte("\n"), nil)
			if bytes.Contains(b, []byte("PRIVATE KEY-----")) {
				t.Errorf("%s holds a PEM private key", path)
			}
			for _, k := range keys {
				if bytes.Contains(flat, k) {
					t.Errorf("%s holds a served private key", path)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkCoreFirstSecret measures the time from starting the agent's
// certificate half (CA client, secret manager, SDS server) to an Envoy-like
// client holding the first "default" secret from the Istio test CA over TLS
// on loopback. It reports the median as p50-ms; run it with -benchtime=20x
// for the median of 20 starts.
func BenchmarkCoreFirstSecret(b *testing.B) {
	ca := istioca.Start(b, istioca.Config{Tokens: map[string]istioca.ServiceAccount{coreToken: coreSA}})
	var samples []time.Duration
	for b.Loop() {
		start := time.Now()
		a := newCoreAgent(b, coreOpts{realClock: true, quietLogs: true, sharedCA: ca})
		c := a.dial()
		s := a.stream(c, "default")
		r := coreNext(b, s)
		if _, _, ok := r.Cert("default"); !ok {
			b.Fatal("no certificate")
		}
		samples = append(samples, time.Since(start))
		s.Close()
		_ = c.Close()
		a.stop()
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(samples[len(samples)-1].Microseconds())/1000, "max-ms")
}
