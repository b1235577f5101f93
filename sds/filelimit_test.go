package sds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/files/fileprovider"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// fileSources is how the file resources of these tests are watched.
var fileSources = certfile.SourceConfig{Debounce: 100 * time.Millisecond}

// podPerConnection resolves each new connection to a pod of its own, as a
// node agent sees the workloads of different pods.
type podPerConnection struct{ n atomic.Int64 }

func (r *podPerConnection) Resolve(context.Context, caller.Cred) (caller.Info, error) {
	n := r.n.Add(1)
	return caller.Info{Pod: fmt.Sprintf("ns/pod-%d", n), PodUID: fmt.Sprintf("uid-%d", n)}, nil
}

// fileRoots writes n trust bundle files and returns their file-root: names.
func (f *fixture) fileRoots(n int) []string {
	f.t.Helper()
	names := make([]string, n)
	for i := range names {
		path := filepath.Join(f.dir, fmt.Sprintf("root-%d.pem", i))
		if err := os.WriteFile(path, f.ca.RootPEM(), 0o600); err != nil {
			f.t.Fatal(err)
		}
		names[i] = secretmanager.FileRootPrefix + path
	}
	return names
}

// newFileFixture serves SDS with a file provider holding at most
// maxHeld names, to callers resolved to one pod per connection.
func newFileFixture(t *testing.T, prov *fileprovider.Provider, config func(*Config)) *fixture {
	f := newFixture(t, fixtureOpts{
		config: config,
		providers: map[string]secretmanager.Provider{
			secretmanager.FileCertPrefix: prov, secretmanager.FileRootPrefix: prov,
		},
		socket: func(c *udsserver.Config) { c.Resolver = &podPerConnection{} },
	})
	f.run("files", prov.Run)
	return f
}

// A client holding as many file resources as it may does not stop another
// client from getting one: its next one is refused, naming it and the
// limit, and counted.
func TestFileResourcesPerCallerDoNotStarveOthers(t *testing.T) {
	prov := fileprovider.New(fileprovider.Config{MaxResources: 4, Files: fileSources})
	f := newFileFixture(t, prov, func(c *Config) { c.MaxFileNamesPerCaller = 2 })
	names := f.fileRoots(5)

	hostile := f.dial()
	var over *sdsclient.Stream
	for i, name := range names[:4] {
		s := f.stream(hostile, sdsclient.StreamConfig{Names: []string{name}})
		if i < 2 {
			if _, ok := next(t, s).TrustedCA(name); !ok {
				t.Fatalf("%s not served within the caller's share", name)
			}
			continue
		}
		code, msg := ended(t, s)
		if code != codes.ResourceExhausted || !strings.Contains(msg, name) || !strings.Contains(msg, "at most 2") {
			t.Fatalf("file resource over the share ended with %v %q, want ResourceExhausted naming %s and the limit", code, msg, name)
		}
		over = s
	}
	if over == nil {
		t.Fatal("the hostile client was never refused")
	}
	if got := testutil.ToFloat64(f.srv.metrics.refused.WithLabelValues(refusedFileNames)); got != 2 {
		t.Errorf("refused{%s} = %v, want 2", refusedFileNames, got)
	}
	if got := prov.Held(); got != 2 {
		t.Errorf("provider holds %d names, want the hostile client's 2", got)
	}

	other := f.stream(f.dial(), sdsclient.StreamConfig{Names: []string{names[4]}})
	if _, ok := next(t, other).TrustedCA(names[4]); !ok {
		t.Fatalf("a second client did not get %s", names[4])
	}
}

// The same caller asking again for a name it holds takes no more of its
// share; releasing a name gives the share back.
func TestFileResourcesPerCallerCountsNamesOnce(t *testing.T) {
	prov := fileprovider.New(fileprovider.Config{Files: fileSources})
	f := newFileFixture(t, prov, func(c *Config) { c.MaxFileNamesPerCaller = 1 })
	names := f.fileRoots(2)
	c := f.dial()
	a := f.stream(c, sdsclient.StreamConfig{Names: []string{names[0]}})
	next(t, a)
	b := f.stream(c, sdsclient.StreamConfig{Names: []string{names[0]}})
	if _, ok := next(t, b).TrustedCA(names[0]); !ok {
		t.Fatal("a second stream of the caller was refused a name it holds")
	}
	a.Close()
	b.Close()
	<-a.Done()
	<-b.Done()
	// The server leaves the watches once the handlers return; a third
	// stream may race them, so wait for the provider to let go first.
	waitHeld(t, prov, 0)
	d := f.stream(c, sdsclient.StreamConfig{Names: []string{names[1]}})
	if _, ok := next(t, d).TrustedCA(names[1]); !ok {
		t.Fatal("the caller's share was not given back")
	}
}

func waitHeld(t *testing.T, prov *fileprovider.Provider, want int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for prov.Held() != want {
		select {
		case <-ctx.Done():
			t.Fatalf("provider holds %d names, want %d", prov.Held(), want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// refuseOnce wraps a source: after the first Watch it refuses, it runs
// hook, which frees a slot before the stream reads the secret.
type refuseOnce struct {
	SecretSource
	once sync.Once
	hook func()
}

func (r *refuseOnce) Watch(id pki.Identity, name string) (<-chan struct{}, func()) {
	ch, cancel := r.SecretSource.Watch(id, name)
	if ch == nil {
		r.once.Do(r.hook)
	}
	return ch, cancel
}

// A name whose watch was refused (the provider's table full) is refused on
// the stream even when a slot frees before its secret is read: it is never
// served unwatched, which would leave it without updates.
func TestFileResourceRefusedWatchIsRefused(t *testing.T) {
	prov := fileprovider.New(fileprovider.Config{MaxResources: 1, Files: fileSources})
	var src *refuseOnce
	f := newFileFixture(t, prov, func(c *Config) {
		src = &refuseOnce{SecretSource: c.Secrets}
		c.Secrets = src
	})
	names := f.fileRoots(2)
	_, release := prov.Watch(names[0]) // fills the table
	src.hook = release

	s := f.stream(f.dial(), sdsclient.StreamConfig{Names: []string{names[1]}})
	code, msg := ended(t, s)
	if code != codes.InvalidArgument || !strings.Contains(msg, names[1]) {
		t.Fatalf("stream ended with %v %q, want InvalidArgument naming %s", code, msg, names[1])
	}
	if got := prov.Held(); got != 0 {
		t.Errorf("provider holds %d names after the refusal, want 0", got)
	}
}
