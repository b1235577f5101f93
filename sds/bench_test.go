package sds

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
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
		roots, err := secret.NewRoots(ca.RootPEM(), "dev-ca")
		if err != nil {
			b.Fatal(err)
		}
		mgr, err := secretmanager.New(secretmanager.Config{Identity: testID, CA: dev, Roots: roots, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		srv, err := New(Config{Secrets: mgr, MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16})
		if err != nil {
			b.Fatal(err)
		}
		uds, err := socketServer(srv, udsserver.Config{SocketPath: socket, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}, 2)
		go func() { _ = mgr.Run(ctx); done <- struct{}{} }()
		go func() { _ = uds.Run(ctx); done <- struct{}{} }()

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

// BenchmarkRotationFanOut1000 measures one rotation reaching 1,000 open
// StreamSecrets streams (spread over 10 connections): from the clock step
// that triggers the renewal to the last stream holding the new certificate.
func BenchmarkRotationFanOut1000(b *testing.B) {
	const streams, conns = 1000, 10
	f := newFixture(b, fixtureOpts{ttl: 30 * time.Second})
	var all []*sdsclient.Stream
	for range conns {
		c := f.dial()
		for range streams / conns {
			s := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
			all = append(all, s)
		}
	}
	for _, s := range all {
		next(b, s)
	}
	for b.Loop() {
		f.step(15 * time.Second)
		for _, s := range all {
			next(b, s)
		}
	}
}
