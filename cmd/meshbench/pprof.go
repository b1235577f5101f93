package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// saveProfile fetches path (e.g. "/debug/pprof/heap?gc=1") from the agent's
// status server into file under dir. It does nothing without a status
// address.
func saveProfile(ctx context.Context, a *agentProc, path, dir, file string) error {
	addr := a.StatusAddr()
	if addr == "" {
		return errors.New("agent status port not known")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching %s: %s", path, resp.Status)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("saving profile: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, file))
	if err != nil {
		return fmt.Errorf("saving profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("saving profile %s: %w", file, err)
	}
	return f.Close()
}

// snapshotProfiles saves the agent's heap profile (after a GC), the same as
// text with the runtime's memory statistics at its end (StackInuse: the
// goroutine stacks) and its goroutine dump under the name label, when
// -pprof-dir is set. Failures are logged, not
// fatal: profiles are an aid, not a figure.
func (b *bench) snapshotProfiles(ctx context.Context, a *agentProc, label string) {
	if b.opts.pprofDir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, p := range []struct{ path, file string }{
		{"/debug/pprof/heap?gc=1", label + ".heap.pb.gz"},
		{"/debug/pprof/heap?debug=1", label + ".heap.txt"},
		{"/debug/pprof/goroutine?debug=1", label + ".goroutines.txt"},
	} {
		if err := saveProfile(ctx, a, p.path, b.opts.pprofDir, p.file); err != nil {
			b.log("profile %s: %v", p.file, err)
		}
	}
}

// cpuProfile starts fetching a CPU profile of d into label.cpu.pb.gz when
// -pprof-dir is set; the returned function waits for it to finish.
func (b *bench) cpuProfile(ctx context.Context, a *agentProc, label string, d time.Duration) (wait func()) {
	if b.opts.pprofDir == "" {
		return func() {}
	}
	ctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		path := fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(1, int(d.Seconds())))
		if err := saveProfile(ctx, a, path, b.opts.pprofDir, label+".cpu.pb.gz"); err != nil {
			b.log("CPU profile %s: %v", label, err)
		}
	}()
	return func() {
		<-done
		cancel()
	}
}
