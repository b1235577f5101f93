package sds

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/test/sdsclient"
)

// ended waits for s to end and returns its gRPC code and message.
func ended(t *testing.T, s *sdsclient.Stream) (codes.Code, string) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("stream did not end")
	}
	st, _ := status.FromError(s.Err())
	return st.Code(), st.Message()
}

func TestMaxStreamsRefusesOverLimit(t *testing.T) {
	f := newFixture(t, fixtureOpts{config: func(c *Config) { c.MaxStreams = 3 }})
	c := f.dial()
	var open []*sdsclient.Stream
	for range 3 {
		s := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
		f.checkCert(next(t, s))
		open = append(open, s)
	}
	over := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
	code, msg := ended(t, over)
	if code != codes.ResourceExhausted || !strings.Contains(msg, "at most 3") {
		t.Fatalf("over-limit stream ended with %v %q, want ResourceExhausted naming the limit", code, msg)
	}
	if got := metricValue(t, f.srv.metrics.refused.WithLabelValues(refusedStreams)); got != 1 {
		t.Errorf("refused{max_streams} = %v, want 1", got)
	}
	if f.logs.FilterMessage("SDS stream refused: too many streams").Len() != 1 {
		t.Error("refusal not logged")
	}

	// The open streams keep working: a rotation reaches them.
	f.step(30 * time.Minute)
	for _, s := range open {
		f.checkCert(next(t, s))
	}
	// A closed stream frees its place.
	open[0].Close()
	waitMetric(t, f.srv.metrics.streams, 2)
	again := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
	f.checkCert(next(t, again))
}

func TestMaxRecvBytesRefusesLargeRequest(t *testing.T) {
	f := newFixture(t, fixtureOpts{config: func(c *Config) { c.MaxRecvBytes = 1024 }})
	c := f.dial()
	live := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
	f.checkCert(next(t, live))

	big := f.stream(c, sdsclient.StreamConfig{Names: []string{strings.Repeat("x", 2048)}})
	if code, _ := ended(t, big); code != codes.ResourceExhausted {
		t.Fatalf("over-size stream request ended with %v, want ResourceExhausted", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Fetch(ctx, strings.Repeat("y", 2048)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over-size fetch: %v, want ResourceExhausted", err)
	}
	// Same connection, other stream: still served.
	f.step(30 * time.Minute)
	f.checkCert(next(t, live))
	if _, err := c.Fetch(ctx, "default"); err != nil {
		t.Fatalf("fetch after the refusals: %v", err)
	}
}

func TestAllowedUIDs(t *testing.T) {
	me := uint32(os.Getuid())
	t.Run("not allowed", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{config: func(c *Config) { c.AllowedUIDs = []uint32{me + 1} }})
		c := f.dial()
		s := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
		if code, msg := ended(t, s); code != codes.PermissionDenied || !strings.Contains(msg, "not allowed") {
			t.Fatalf("stream ended with %v %q, want PermissionDenied", code, msg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Fetch(ctx, "default"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("fetch: %v, want PermissionDenied", err)
		}
		if got := metricValue(t, f.srv.metrics.refused.WithLabelValues(refusedUID)); got != 2 {
			t.Errorf("refused{uid} = %v, want 2", got)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{config: func(c *Config) { c.AllowedUIDs = []uint32{me + 1, me} }})
		c := f.dial()
		s := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
		f.checkCert(next(t, s))
		// The connection's peer credentials are logged once, with our uid and pid.
		logged := f.logs.FilterMessage("SDS client connected").All()
		if len(logged) == 0 {
			t.Fatal("connection not logged")
		}
		fields := logged[len(logged)-1].ContextMap()
		if fields[keyUID] != me || fields[keyPID] != int32(os.Getpid()) {
			t.Fatalf("logged %v, want uid %d pid %d", fields, me, os.Getpid())
		}
	})
}
