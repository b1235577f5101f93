package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/internal/files/filewatch"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// Hostile SDS clients: they ask for file resources that are hard to serve.
const (
	// numNames distinct file-root: names are asked for over time, more than
	// the agent holds at once (64).
	numNames = 200
	// nameCyclers clients walk the names, one stream per name.
	nameCyclers = 4
	// fileSettle is how long after a file change a client holding the
	// resource may still hold the old content: a poll interval, the
	// debounce and slack for a loaded machine.
	fileSettle = filewatch.DefaultPollInterval + 4*time.Second
)

// hostileCounts are what the hostile clients did.
type hostileCounts struct {
	unwatchable, vanishing   fileCounts
	nameStreams, namesServed int64
	distinctNames            int
	unwatchableReal          bool
}

type fileCounts struct {
	sessions, rewrites, updates int64
}

// fileTarget is a root bundle file that the soak rewrites, and what a client
// subscribed to it must hold once the change has settled.
type fileTarget struct {
	kind string
	dir  string
	path string
	// remake deletes and re-creates the directory at every rewrite
	// (rm -rf dir; mkdir dir; cp ...).
	remake bool
	roots  [2][]byte

	mu   sync.Mutex
	want []byte
	at   time.Time
	n    int

	rewrites atomic.Int64
}

func (f *fileTarget) name() string { return secretmanager.FileRootPrefix + f.path }

func (f *fileTarget) current() ([]byte, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.want, f.at
}

// rewrite writes the other root, readable by everyone.
func (f *fileTarget) rewrite() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	data := f.roots[f.n%2]
	f.n++
	if f.remake {
		if err := os.RemoveAll(f.dir); err != nil {
			return err
		}
		if err := os.Mkdir(f.dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.path, data, 0o644); err != nil {
			return err
		}
	} else {
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, f.path); err != nil {
			return err
		}
	}
	f.want, f.at = data, time.Now()
	f.rewrites.Add(1)
	return nil
}

// fileClient holds one stream on a fileTarget's resource at a time.
type fileClient struct {
	target   *fileTarget
	sessions atomic.Int64
	updates  atomic.Int64

	mu        sync.Mutex
	connected bool
	since     time.Time
	got       []byte
}

// hostile runs the hostile clients and the file rewriters.
type hostile struct {
	socket      string
	led         *ledger
	unwatchable *fileClient
	vanishing   *fileClient
	names       []string
	nameStreams atomic.Int64
	namesServed atomic.Int64
	servedMu    sync.Mutex
	served      map[string]bool
	realLock    bool
}

// newHostile lays out the files under dir: a root in a directory the agent
// (running as agentUID, -1 for this process's user) may read but not list,
// a root whose directory is deleted and made again, and numNames roots.
func newHostile(dir, socket string, agentUID int, led *ledger) (*hostile, error) {
	var roots [2][]byte
	for i := range roots {
		ca, err := localca.New(localca.Config{Name: fmt.Sprintf("meshsoak file root %d", i)})
		if err != nil {
			return nil, err
		}
		roots[i] = ca.RootPEM()
	}
	h := &hostile{socket: socket, led: led, served: map[string]bool{}}
	h.realLock = agentUID > 0 && agentUID != os.Geteuid()
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}

	locked := filepath.Join(dir, "locked")
	if err := os.Mkdir(locked, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(locked, 0o711); err != nil {
		return nil, err
	}
	h.unwatchable = &fileClient{target: &fileTarget{kind: "unwatchable", dir: locked, path: filepath.Join(locked, "root.pem"), roots: roots}}
	vanish := filepath.Join(dir, "vanishing")
	if err := os.Mkdir(vanish, 0o755); err != nil {
		return nil, err
	}
	h.vanishing = &fileClient{target: &fileTarget{kind: "vanishing", dir: vanish, path: filepath.Join(vanish, "root.pem"), remake: true, roots: roots}}
	for _, c := range []*fileClient{h.unwatchable, h.vanishing} {
		if err := c.target.rewrite(); err != nil {
			return nil, fmt.Errorf("writing %s root: %w", c.target.kind, err)
		}
		c.target.rewrites.Store(0)
	}

	names := filepath.Join(dir, "names")
	if err := os.Mkdir(names, 0o755); err != nil {
		return nil, err
	}
	for i := range numNames {
		p := filepath.Join(names, fmt.Sprintf("root-%03d.pem", i))
		if err := os.WriteFile(p, roots[i%2], 0o644); err != nil {
			return nil, err
		}
		h.names = append(h.names, secretmanager.FileRootPrefix+p)
	}
	return h, nil
}

// run drives every hostile client and rewriter until ctx ends.
func (h *hostile) run(ctx context.Context, rng *rand.Rand) {
	var wg sync.WaitGroup
	for _, c := range []*fileClient{h.unwatchable, h.vanishing} {
		r1 := rand.New(rand.NewPCG(rng.Uint64(), 11))
		r2 := rand.New(rand.NewPCG(rng.Uint64(), 12))
		wg.Go(func() { h.rewriteLoop(ctx, c.target, r1) })
		wg.Go(func() { h.fileClientLoop(ctx, c, r2) })
	}
	for i := range nameCyclers {
		start := i * numNames / nameCyclers
		wg.Go(func() { h.nameLoop(ctx, start) })
	}
	wg.Wait()
}

func (h *hostile) rewriteLoop(ctx context.Context, f *fileTarget, rng *rand.Rand) {
	for sleepCtx(ctx, time.Duration(4000+rng.IntN(4000))*time.Millisecond) {
		if err := f.rewrite(); err != nil {
			h.led.Violate("soak", "rewriting the %s root: %v", f.kind, err)
			return
		}
	}
}

// fileClientLoop keeps a stream on c's resource, reconnecting after a while.
// A refusal while the file is briefly missing (a vanishing directory) is
// allowed; the stream then comes back.
func (h *hostile) fileClientLoop(ctx context.Context, c *fileClient, rng *rand.Rand) {
	for ctx.Err() == nil {
		h.fileSession(ctx, c, time.Duration(10+rng.IntN(20))*time.Second)
		if !sleepCtx(ctx, time.Duration(rng.IntN(1000))*time.Millisecond) {
			return
		}
	}
}

func (h *hostile) fileSession(ctx context.Context, c *fileClient, stay time.Duration) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cl, err := sdsclient.Dial(dctx, h.socket)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			h.led.Violate("sds_dial", "%v", err)
		}
		return
	}
	defer cl.Close()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	leave := time.AfterFunc(stay, stop)
	defer leave.Stop()
	name := c.target.name()
	st, err := cl.Stream(sctx, sdsclient.StreamConfig{Names: []string{name}})
	if err != nil {
		return
	}
	defer st.Close()
	c.sessions.Add(1)
	defer func() {
		c.mu.Lock()
		c.connected, c.got = false, nil
		c.mu.Unlock()
	}()
	for first := true; ; first = false {
		r, err := st.Next(sctx)
		if err != nil {
			// Refused at the start while the vanishing file is missing:
			// allowed. Once served, a stream must last.
			if sctx.Err() == nil && !(first && c.target.remake) {
				h.led.Violate("file_"+c.target.kind, "stream ended: %v", err)
			}
			return
		}
		got, ok := r.TrustedCA(name)
		if !ok {
			h.led.Violate("file_"+c.target.kind, "response without %s", name)
			return
		}
		c.updates.Add(1)
		c.mu.Lock()
		if !c.connected {
			c.connected, c.since = true, time.Now()
		}
		c.got = got
		c.mu.Unlock()
	}
}

// check records a violation when a file client connected for a while does
// not hold the content its file settled on.
func (h *hostile) check(now time.Time) {
	for _, c := range []*fileClient{h.unwatchable, h.vanishing} {
		want, at := c.target.current()
		c.mu.Lock()
		connected, since, got := c.connected, c.since, c.got
		c.mu.Unlock()
		if !connected || now.Sub(since) < fileSettle || now.Sub(at) < fileSettle {
			continue
		}
		if !bytes.Equal(got, want) {
			h.led.Violate("file_"+c.target.kind, "the client holds an old root %s after the file changed", now.Sub(at).Round(time.Millisecond))
		}
	}
}

// nameLoop walks the names from start, one stream per name held briefly:
// every one must be served, however many were asked for before.
func (h *hostile) nameLoop(ctx context.Context, start int) {
	cl, err := sdsclient.Dial(ctx, h.socket)
	if err != nil {
		return
	}
	defer cl.Close()
	for i := start; ctx.Err() == nil; i = (i + 1) % len(h.names) {
		name := h.names[i]
		if err := h.askName(ctx, cl, name); err != nil {
			if ctx.Err() == nil {
				h.led.Violate("file_names", "%s: %v", filepath.Base(name), err)
			}
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return
		}
	}
}

func (h *hostile) askName(ctx context.Context, cl *sdsclient.Client, name string) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := cl.Stream(sctx, sdsclient.StreamConfig{Names: []string{name}})
	if err != nil {
		return err
	}
	defer st.Close()
	h.nameStreams.Add(1)
	wctx, wcancel := context.WithTimeout(sctx, 10*time.Second)
	defer wcancel()
	r, err := st.Next(wctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if _, ok := r.TrustedCA(name); !ok {
		return errors.New("response without the name")
	}
	h.namesServed.Add(1)
	h.servedMu.Lock()
	h.served[name] = true
	h.servedMu.Unlock()
	sleepCtx(ctx, 200*time.Millisecond)
	return nil
}

func (h *hostile) counts() hostileCounts {
	h.servedMu.Lock()
	distinct := len(h.served)
	h.servedMu.Unlock()
	fc := func(c *fileClient) fileCounts {
		return fileCounts{sessions: c.sessions.Load(), rewrites: c.target.rewrites.Load(), updates: c.updates.Load()}
	}
	return hostileCounts{
		unwatchable: fc(h.unwatchable), vanishing: fc(h.vanishing),
		nameStreams: h.nameStreams.Load(), namesServed: h.namesServed.Load(),
		distinctNames: distinct, unwatchableReal: h.realLock,
	}
}
