package test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

const coreToken = "token-ns1-sa1"

var coreSA = istioca.ServiceAccount{Namespace: "ns1", Name: "sa1"}

// coreAgent is the agent (internal/app, as cmd/agent runs it) in CA mode
// against the Istio test CA over TLS, on a fake clock, serving SDS on a Unix
// socket.
type coreAgent struct {
	*appAgent
	ca *istioca.Server
	id pki.Identity
	// rootFile is CA_ROOT_CA.
	rootFile string
}

type coreOpts struct {
	ttl       time.Duration
	realClock bool // benchmarks: no fake clock
	quietLogs bool
	sharedCA  *istioca.Server
	// caDown starts the agent with the CA stopped.
	caDown bool
}

func newCoreAgent(t testing.TB, o coreOpts) *coreAgent {
	t.Helper()
	if o.ttl == 0 {
		o.ttl = time.Hour
	}
	// The CA and the agent share one fake clock, made here for the CA and
	// handed to the agent.
	a := &coreAgent{ca: o.sharedCA}
	clock := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	now := clock.Now
	if o.realClock {
		now = time.Now
	}
	if a.ca == nil {
		a.ca = istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{coreToken: coreSA}, Now: now})
	}
	a.id = a.ca.Identity(coreSA)
	if o.caDown {
		a.ca.Stop()
	}

	files := shortTempDir(t)
	tokenPath := filepath.Join(files, "istio-token")
	a.rootFile = filepath.Join(files, "root-cert.pem")
	for path, b := range map[string][]byte{tokenPath: []byte(coreToken + "\n"), a.rootFile: a.ca.RootPEM()} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a.appAgent = startApp(t, appOpts{
		env: []string{
			"CA_ADDR=" + a.ca.Addr(), "ISTIOD_SAN=" + a.ca.ServerName(), "CA_ROOT_CA=" + a.rootFile,
			"MESHAGENT_TOKEN_PATH=" + tokenPath, "ISTIO_META_CLUSTER_ID=Kubernetes",
			"POD_NAMESPACE=" + coreSA.Namespace, "SERVICE_ACCOUNT=" + coreSA.Name,
			"SECRET_TTL=" + o.ttl.String(),
			// No jitter: renewal at exactly half the life.
			"SECRET_GRACE_PERIOD_RATIO_JITTER=0",
		},
		clock:     clock,
		realClock: o.realClock,
		quietLogs: o.quietLogs,
	})
	a.dirs = append(a.dirs, files)
	return a
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
	if code := a.health("ready"); code != http.StatusOK {
		t.Errorf("/healthz/ready answers %d with a certificate held", code)
	}
}

func TestCoreRotationOnSameStream(t *testing.T) {
	a := newCoreAgent(t, coreOpts{ttl: 30 * time.Second})
	s := a.stream(a.dial(), "default")
	oldLeaf, oldExpiry := a.checkDefault(coreNext(t, s))

	a.stepFiringNothing(14*time.Second, "before renew_at")
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
	a := newCoreAgent(t, coreOpts{ttl: 10 * time.Minute})
	c := a.dial()
	s := a.stream(c, "default")
	oldLeaf, oldExpiry := a.checkDefault(coreNext(t, s))

	a.ca.Stop()
	a.step(5 * time.Minute) // renew_at, with the CA down
	start := a.clock.Now()
	for a.clock.Since(start) < 20*time.Second {
		a.step(time.Second)
		if code := a.health("ready"); code != http.StatusOK {
			t.Fatalf("/healthz/ready answers %d during the outage", code)
		}
	}
	// Nothing is pushed during the outage: the first response on s after
	// it must carry a new certificate (checked below).
	// A new Envoy stream still gets the held certificate.
	during, _ := a.checkDefault(coreNext(t, a.stream(c, "default")))
	if !bytes.Equal(during, oldLeaf) {
		t.Fatal("a different certificate was served during the outage")
	}
	waitFor(t, "4 failed requests logged in 20 s of outage", func() bool {
		return a.logs.FilterMessage("certificate request failed").Len() >= 4
	})

	// The CA comes back. The clock moves on only until the manager's next
	// retry reaches it; the answer then comes in real time.
	asked := a.ca.Requests()
	a.ca.Restart(t)
	testwait.For(t, "a retry reaching the CA", func() bool {
		if a.ca.Requests() != asked {
			return true
		}
		if a.clock.Since(start) > 2*time.Minute {
			t.Fatal("no retry reached the CA within 2 min of its return")
		}
		a.step(time.Second)
		return false
	})
	newLeaf, _ := a.checkDefault(coreNext(t, s))
	if bytes.Equal(newLeaf, oldLeaf) || !a.clock.Now().Before(oldExpiry) {
		t.Fatal("renewal after the outage did not replace the certificate in time")
	}
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
		{istioca.ModeLeafIsCA, "leaf_is_ca"},
		{istioca.ModeNoDigitalSignature, "key_usage"},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			a := newCoreAgent(t, coreOpts{})
			s := a.stream(a.dial(), "default")
			oldLeaf, _ := a.checkDefault(coreNext(t, s))

			a.ca.SetMode(tt.mode)
			a.step(30 * time.Minute)
			waitFor(t, "the rejection", func() bool { return a.logs.FilterMessage("CA answer rejected").Len() > 0 })
			logs := a.logs.FilterMessage("CA answer rejected").All()
			if len(logs) != 1 || logs[0].ContextMap()["reason"] != tt.reason {
				t.Fatalf("rejection logs %v, want one with reason %s", logs, tt.reason)
			}
			if got := coreCounter(t, a.reg, "meshagent_ca_answers_rejected_total", "reason", tt.reason); got != 1 {
				t.Errorf("meshagent_ca_answers_rejected_total{reason=%q} = %v, want 1", tt.reason, got)
			}
			if code := a.health("ready"); code != http.StatusOK {
				t.Fatalf("/healthz/ready answers %d: the held certificate was dropped", code)
			}

			// The bad answer was not pushed: the next response on s is
			// the good one (checkDefault fails on any other).
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
	a := newCoreAgent(t, coreOpts{caDown: true})
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
	// for default (every name resolves on its own: docs/architecture.md).
	for _, s := range streams {
		if r := coreNext(t, s); len(r.Names) != 1 || r.Names[0] != "ROOTCA" {
			t.Fatalf("first response holds %v, want ROOTCA alone", r.Names)
		}
	}
	// The CA comes up; the manager's retry reaches it.
	a.ca.Restart(t)
	got := make(chan *sdsclient.Response, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if r, err := streams[0].Next(ctx); err == nil {
			got <- r
		}
		close(got)
	}()
	var firstResponse *sdsclient.Response
	for firstResponse == nil {
		a.step(time.Second)
		select {
		case r, ok := <-got:
			if !ok {
				t.Fatal("no certificate after the CA came up")
			}
			firstResponse = r
		case <-time.After(20 * time.Millisecond):
		}
	}
	var first []byte
	for i, s := range streams {
		r := firstResponse
		if i > 0 {
			r = coreNext(t, s)
		}
		leaf, _ := a.checkDefault(r)
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
	// The first response holds both once the certificate exists.
	a.waitHealth("ready", http.StatusOK)
	s := a.stream(a.dial(), "default", "ROOTCA")
	r := coreNext(t, s)
	_, notAfter := a.checkDefault(r)
	a.ca.SetMode(istioca.ModeError)
	a.ca.SetError(codes.Unavailable)
	for a.clock.Now().Before(notAfter) {
		a.step(10 * time.Minute)
	}
	a.waitHealth("live", http.StatusServiceUnavailable)
	next, err := localca.New(localca.Config{Name: "next root"})
	if err != nil {
		t.Fatal(err)
	}
	// CA_ROOT_CA gains a root; the agent sees the file change once its
	// debounce (FILE_DEBOUNCE_DURATION, on the fake clock) has passed.
	bundle := append(append([]byte{}, a.ca.RootPEM()...), next.RootPEM()...)
	if err := os.WriteFile(a.rootFile+".tmp", bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(a.rootFile+".tmp", a.rootFile); err != nil {
		t.Fatal(err)
	}
	r = nil
	for deadline := time.Now().Add(10 * time.Second); r == nil; {
		a.clock.Step(100 * time.Millisecond)
		select {
		case r = <-s.Responses():
		case <-time.After(20 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("the new root bundle was not pushed")
			}
		}
	}
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
