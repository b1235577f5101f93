package certfile_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/localca"
)

// A Source serves the last good root bundle and says when it changes.
func ExampleNewBundleSource() {
	dir, err := os.MkdirTemp("", "roots")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ca, err := localca.New(localca.Config{})
	if err != nil {
		log.Fatal(err)
	}
	path := filepath.Join(dir, "root-cert.pem")
	if err := os.WriteFile(path, ca.RootPEM(), 0o644); err != nil {
		log.Fatal(err)
	}

	src, err := certfile.NewBundleSource(certfile.SourceConfig{Debounce: 100 * time.Millisecond}, path)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()

	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	roots, err := src.Wait(wctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("roots:", len(roots.Certs()))

	// Add a second root, as during a root rotation.
	_, _, changed := src.Current()
	next, err := localca.New(localca.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(path, append(ca.RootPEM(), next.RootPEM()...), 0o644); err != nil {
		log.Fatal(err)
	}
	<-changed
	roots, _, _ = src.Current()
	fmt.Println("roots:", len(roots.Certs()))

	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// roots: 1
	// roots: 2
}
