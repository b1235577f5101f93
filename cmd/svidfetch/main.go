// Command svidfetch fetches the X.509-SVID and trust bundle an agent serves
// on its socket over the SPIFFE Workload API (go-spiffe's client, as any
// SPIFFE workload would), prints what it got and, with -o, writes
// svid.pem, svid.key and bundle.pem. It is the README's "try it" step:
//
//	go run ./cmd/svidfetch -socket .run/var/run/secrets/workload-spiffe-uds/socket
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshagent/meshagent/internal/files/atomicfile"
)

func main() {
	socket := flag.String("socket", "var/run/secrets/workload-spiffe-uds/socket", "the agent's socket (SDS and the SPIFFE Workload API)")
	out := flag.String("o", "", "directory to write svid.pem, svid.key and bundle.pem to; empty writes nothing")
	timeout := flag.Duration("timeout", 10*time.Second, "how long to wait for the agent")
	flag.Parse()
	if err := run(*socket, *out, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "svidfetch: "+err.Error())
		os.Exit(1)
	}
}

func run(socket, out string, timeout time.Duration) error {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The agent may still be starting: wait for its socket.
	for {
		if _, err := os.Stat(abs); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no socket at %s after %s: is the agent running (make run)?", abs, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
	x509ctx, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr("unix://"+abs))
	if err != nil {
		return fmt.Errorf("fetching from %s: %w", abs, err)
	}
	svid := x509ctx.DefaultSVID()
	leaf := svid.Certificates[0]
	fmt.Printf("spiffe_id:  %s\nserial:     %x\nnot_before: %s\nnot_after:  %s\nissuer:     %s\n",
		svid.ID, leaf.SerialNumber, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339), leaf.Issuer)
	bundle, err := x509ctx.Bundles.GetX509BundleForTrustDomain(svid.ID.TrustDomain())
	if err != nil {
		return err
	}
	fmt.Printf("bundle:     %d root(s) for %s\n", len(bundle.X509Authorities()), svid.ID.TrustDomain())
	if out == "" {
		return nil
	}
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		return err
	}
	bundlePEM, err := bundle.Marshal()
	if err != nil {
		return err
	}
	if err := writeFiles(out, map[string][]byte{"svid.pem": certPEM, "svid.key": keyPEM, "bundle.pem": bundlePEM}); err != nil {
		return err
	}
	fmt.Printf("wrote svid.pem, svid.key and bundle.pem to %s\n", out)
	return nil
}

// writeFiles writes each file 0600 into the directory out (made if
// missing; a link there is refused), through the open directory: a new
// file is created with O_EXCL|O_NOFOLLOW and renamed over the name, so a
// link or file someone put at a name is replaced, never written through.
func writeFiles(out string, files map[string][]byte) error {
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	dir, err := atomicfile.OpenDir(out)
	if err != nil {
		return err
	}
	defer dir.Close()
	for name, b := range files {
		p, err := dir.Prepare(name, b, 0o600)
		if err != nil {
			return err
		}
		if err := p.Commit(); err != nil {
			return err
		}
	}
	dir.Sync()
	return nil
}
