package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// slot is one SDS client position: a client that connects, holds a stream
// for a while, disconnects and comes back.
type slot struct {
	mu          sync.Mutex
	connected   bool
	connectedAt time.Time
	held        held
}

func (s *slot) set(connected bool, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected, s.connectedAt, s.held = connected, at, held{}
}

func (s *slot) hold(h held) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = h
}

// snapshot is whether the slot is connected, since when, and what it holds.
func (s *slot) snapshot() (bool, time.Time, held) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected, s.connectedAt, s.held
}

// clientPool runs the SDS clients.
type clientPool struct {
	socket   string
	identity pki.Identity
	slots    []*slot
	led      *ledger
	connects atomic.Int64
	slowOnes atomic.Int64
}

// run drives slot i until ctx ends: connect, subscribe, read (slowly for
// some), disconnect after a random while, pause, again.
func (p *clientPool) run(ctx context.Context, i int, rng *rand.Rand) {
	s := p.slots[i]
	for ctx.Err() == nil {
		slow := rng.IntN(5) == 0
		stay := time.Duration(3+rng.IntN(30)) * time.Second
		p.session(ctx, s, slow, stay, rng.Int64())
		if !sleepCtx(ctx, time.Duration(rng.IntN(3000))*time.Millisecond) {
			return
		}
	}
}

func (p *clientPool) session(ctx context.Context, s *slot, slow bool, stay time.Duration, seed int64) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := sdsclient.Dial(dctx, p.socket)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			p.led.Violate("sds_dial", "%v", err)
		}
		return
	}
	defer c.Close()
	buf := 16
	if slow {
		buf = 1
		p.slowOnes.Add(1)
	}
	// A timer, not a deadline: a deadline would travel to the agent as
	// grpc-timeout and end the stream from its side.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	leave := time.AfterFunc(stay, stop)
	defer leave.Stop()
	st, err := c.Stream(sctx, sdsclient.StreamConfig{
		Names:  []string{secretmanager.WorkloadCertName, secretmanager.RootCertName},
		Buffer: buf,
	})
	if err != nil {
		if sctx.Err() == nil {
			p.led.Violate("sds_stream", "%v", err)
		}
		return
	}
	p.connects.Add(1)
	s.set(true, time.Now())
	defer s.set(false, time.Time{})
	defer st.Close()
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	for {
		if slow && !sleepCtx(sctx, time.Duration(200+rng.IntN(2000))*time.Millisecond) {
			return
		}
		r, err := st.Next(sctx)
		if err != nil {
			if sctx.Err() == nil && errors.Is(err, sdsclient.ErrEnded) {
				p.led.Violate("sds_stream_ended", "%v", err)
			}
			return
		}
		if chain, key, ok := r.Cert(secretmanager.WorkloadCertName); ok {
			s.hold(held{Chain: chain, Key: key})
		}
	}
}

// check records a violation for every client connected longer than grace
// whose "default" is missing or bad at now.
func (p *clientPool) check(now time.Time, grace time.Duration) (checked int) {
	for i, s := range p.slots {
		connected, since, h := s.snapshot()
		if !connected || now.Sub(since) < grace {
			continue
		}
		checked++
		if err := checkHeld(h, p.identity, now); err != nil {
			p.led.Violate("sds_default", "client %d: %v", i, err)
		}
	}
	return checked
}

// runADS keeps one ADS stream open through the agent's xDS proxy, opening a
// new one whenever it ends, until ctx ends. It returns how many it opened.
func runADS(ctx context.Context, socket string) int {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0
	}
	defer conn.Close()
	client := discovery.NewAggregatedDiscoveryServiceClient(conn)
	opened := 0
	for ctx.Err() == nil {
		func() {
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			st, err := client.StreamAggregatedResources(sctx, grpc.WaitForReady(true))
			if err != nil {
				return
			}
			opened++
			err = st.Send(&discovery.DiscoveryRequest{
				Node:    &corev3.Node{Id: "sidecar~127.0.0.1~meshsoak.soak~soak.svc.cluster.local"},
				TypeUrl: resource.ClusterType,
			})
			for err == nil {
				_, err = st.Recv()
			}
		}()
		sleepCtx(ctx, 200*time.Millisecond)
	}
	return opened
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
