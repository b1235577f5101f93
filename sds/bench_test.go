package sds

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/localca"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// BenchmarkFirstSecret measures the time from starting the secret manager
// and the SDS server to an Envoy-like client holding the first "default"
// secret, with the in-process CA (key generation, CSR, signing, checks,
// socket, gRPC). It reports the median as p50-ms.
func BenchmarkFirstSecret(b *testing.B) {
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		b.Fatal(err)
	}
	dir := shortDir(b)
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		socket := filepath.Join(dir, "s", "socket")
		start := time.Now()
		dev, _ := devca.New(devca.Config{CA: ca})
		roots, err := secretmanager.NewRoots(ca.RootPEM(), "dev-ca")
		if err != nil {
			b.Fatal(err)
		}
		mgr, err := secretmanager.New(secretmanager.Config{Identity: testID, CA: dev, Roots: roots})
		if err != nil {
			b.Fatal(err)
		}
		srv, err := New(Config{SocketPath: socket, Secrets: mgr})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}, 2)
		go func() { _ = mgr.Run(ctx); done <- struct{}{} }()
		go func() { _ = srv.Run(ctx); done <- struct{}{} }()

		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := sdsclient.Dial(dctx, socket)
		if err != nil {
			b.Fatal(err)
		}
		s, err := c.Stream(dctx, sdsclient.StreamConfig{Names: []string{"default"}})
		if err != nil {
			b.Fatal(err)
		}
		r, err := s.Next(dctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, ok := r.Cert("default"); !ok {
			b.Fatal("no certificate")
		}
		samples = append(samples, time.Since(start))

		s.Close()
		_ = c.Close()
		dcancel()
		cancel()
		<-done
		<-done
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "p50-ms")
}
