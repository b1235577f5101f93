package sds

import (
	"bytes"
	"context"
	"reflect"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// countingSource counts the watches its streams hold on the source.
type countingSource struct {
	SecretSource
	mu     sync.Mutex
	active map[string]int
	opened int
}

func (c *countingSource) Watch(id pki.Identity, name string) (<-chan struct{}, func()) {
	ch, cancel := c.SecretSource.Watch(id, name)
	c.mu.Lock()
	c.active[name]++
	c.opened++
	c.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			c.mu.Lock()
			c.active[name]--
			c.mu.Unlock()
			cancel()
		})
	}
}

func (c *countingSource) counts(name string) (active, opened int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active[name], c.opened
}

// packageGoroutines counts the goroutines running code of this package,
// whatever the function: a renamed handler or push loop still counts.
func packageGoroutines() int {
	frame := reflect.TypeFor[Server]().PkgPath() + "."
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for g := range strings.SplitSeq(b.String(), "\n\n") {
		if strings.Contains(g, frame) {
			n++
		}
	}
	return n
}

// Streams of one caller identity share one watch on the source, a waiting
// stream holds one goroutine (its handler), each rotation reaches every
// stream, and leaving streams release the watch.
func TestStreamsShareOneWatchAndOneGoroutineEach(t *testing.T) {
	const conns, perConn = 3, 10
	var src *countingSource
	f := newFixture(t, fixtureOpts{ttl: 30 * time.Second, config: func(c *Config) {
		src = &countingSource{SecretSource: c.Secrets, active: map[string]int{}}
		c.Secrets = src
	}})
	// The connections, each used once so that both ends have set them up.
	clients := make([]*sdsclient.Client, conns)
	for i := range clients {
		clients[i] = f.dial()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := clients[i].Fetch(ctx, "default")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	// What runs before any stream opens: the test, the socket server and
	// its connections, the manager.
	before, idle := goleak.IgnoreCurrent(), packageGoroutines()
	var all []*sdsclient.Stream
	for _, c := range clients {
		for range perConn {
			all = append(all, f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}}))
		}
	}
	first := make([]*sdsclient.Response, len(all))
	for i, s := range all {
		first[i] = next(t, s)
		f.checkCert(first[i])
	}
	if active, opened := src.counts("default"); active != 1 || opened != 1 {
		t.Fatalf("%d streams hold %d watches (%d opened), want 1", len(all), active, opened)
	}
	// Once the first pushes are done, each stream holds its handler and the
	// shared watch one fan-out goroutine: nothing else of this package runs.
	testwait.For(t, "one goroutine a stream", func() bool { return packageGoroutines()-idle == len(all)+1 })

	f.step(15 * time.Second)
	for i, s := range all {
		r := next(t, s)
		f.checkCert(r)
		if r.Nonce == first[i].Nonce || bytes.Equal(r.Secrets["default"].GetTlsCertificate().GetCertificateChain().GetInlineBytes(),
			first[i].Secrets["default"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) {
			t.Fatalf("stream %d: the push repeats the first response", i)
		}
	}

	for _, s := range all {
		s.Close()
	}
	testwait.For(t, "the watch to be released", func() bool { active, _ := src.counts("default"); return active == 0 })
	// Every goroutine the streams started ends.
	if err := goleak.Find(before); err != nil {
		t.Fatalf("goroutines left by closed streams: %v", err)
	}
}

// The encoded resource of a secret is made once and shared by every
// response that carries it; sending it never changes it.
func TestSharedEncodingIsNotMutated(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	c := f.dial()
	var all []*sdsclient.Stream
	for range 20 {
		all = append(all, f.stream(c, sdsclient.StreamConfig{Names: []string{"default", "ROOTCA"}}))
	}
	var got [][]byte
	for _, s := range all {
		r := next(t, s)
		got = append(got, r.Raw.GetResources()[0].GetValue())
	}
	sec, err := f.mgr.Secret(context.Background(), pki.Identity{}, secretmanager.WorkloadCertName)
	if err != nil {
		t.Fatal(err)
	}
	shared := f.srv.encoded.get(secretmanager.WorkloadCertName, sec)
	fresh, err := toAny(secretmanager.WorkloadCertName, sec)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(shared, fresh) || !bytes.Equal(shared.GetValue(), fresh.GetValue()) {
		t.Fatal("the shared encoding differs from a fresh one")
	}
	for i, b := range got {
		if !bytes.Equal(b, fresh.GetValue()) {
			t.Fatalf("stream %d got other bytes than the encoding", i)
		}
	}
	again := f.srv.encoded.get(secretmanager.WorkloadCertName, sec)
	if again != shared {
		t.Fatal("a second look-up encoded the secret again")
	}
	// The wire form every stream was sent is still the resource field of
	// a fresh encoding.
	field := f.srv.encoded.field(secretmanager.WorkloadCertName, sec)
	b, err := proto.Marshal(&discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{fresh}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(field.ReadOnlyData(), b) {
		t.Fatal("the shared wire form of the resource changed")
	}
}

// Under rotations faster than a client reads, every stream ends holding the
// newest certificate and never receives an older one after a newer one.
func TestStreamsGetNewestVersionInOrder(t *testing.T) {
	f := newFixture(t, fixtureOpts{ttl: 30 * time.Second})
	c := f.dial()
	var all []*sdsclient.Stream
	for range 10 {
		all = append(all, f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}}))
	}
	for _, s := range all {
		next(t, s)
	}
	for range 5 {
		f.step(15 * time.Second)
		f.waitCert()
	}
	// A renewal may still be on its way: the newest is what the manager
	// holds when a stream has caught up with it.
	newest := func() []byte {
		sec, err := f.mgr.Secret(context.Background(), pki.Identity{}, secretmanager.WorkloadCertName)
		if err != nil {
			t.Fatal(err)
		}
		return sec.CertChain
	}
	for i, s := range all {
		var (
			last   []byte
			issued time.Time
			pushes int
		)
		for !bytes.Equal(last, newest()) {
			r := next(t, s)
			chain, _, ok := r.Cert(secretmanager.WorkloadCertName)
			if !ok {
				t.Fatalf("stream %d: a push without the certificate", i)
			}
			certs, err := pki.ParseCertificates(chain)
			if err != nil {
				t.Fatal(err)
			}
			if !certs[0].NotBefore.After(issued) {
				t.Fatalf("stream %d: a certificate issued at %v after one issued at %v", i, certs[0].NotBefore, issued)
			}
			last, issued = chain, certs[0].NotBefore
			pushes++
		}
		if pushes > 5 {
			t.Fatalf("stream %d got %d pushes for 5 rotations", i, pushes)
		}
	}
}

// An encoding is dropped once its secret is collected: a rotated-out key
// does not stay in memory through the cache.
func TestEncodingDroppedWithItsSecret(t *testing.T) {
	var c encodedCache
	func() {
		sec := &secretmanager.Secret{Name: "ROOTCA", Roots: []byte("-----BEGIN CERTIFICATE-----\n"), Version: 1}
		if c.field("ROOTCA", sec).Len() == 0 {
			t.Fatal("no encoding")
		}
	}()
	if entries(&c) != 1 {
		t.Fatalf("%d entries, want 1", entries(&c))
	}
	testwait.For(t, "the entry to be dropped", func() bool {
		runtime.GC()
		return entries(&c) == 0
	})
}

// entries returns the number of encodings c holds.
func entries(c *encodedCache) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
