package sds

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// TestMaxStreamsPerCallerBoundsOnePod: a pod over its own bound is refused
// naming it, while another pod still opens its streams within the global
// bound, and a stream the first pod closes gives it its place back.
func TestMaxStreamsPerCallerBoundsOnePod(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		config: func(c *Config) { c.MaxStreams = 10; c.MaxStreamsPerCaller = 2 },
		socket: func(c *udsserver.Config) { c.Resolver = &podPerConnection{} },
	})
	podA := f.dial()
	var openA []*sdsclient.Stream
	for range 2 {
		s := f.stream(podA, sdsclient.StreamConfig{Names: []string{"default"}})
		f.checkCert(next(t, s))
		openA = append(openA, s)
	}
	over := f.stream(podA, sdsclient.StreamConfig{Names: []string{"default"}})
	code, msg := ended(t, over)
	if code != codes.ResourceExhausted || !strings.Contains(msg, "from this caller: at most 2") {
		t.Fatalf("pod's third stream ended with %v %q, want ResourceExhausted naming the per-caller limit", code, msg)
	}
	if got := testutil.ToFloat64(f.srv.metrics.refused.WithLabelValues(refusedStreamsPerCaller)); got != 1 {
		t.Errorf("refused{max_streams_per_caller} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.srv.metrics.refused.WithLabelValues(refusedStreams)); got != 0 {
		t.Errorf("refused{max_streams} = %v, want 0", got)
	}
	if f.logs.FilterMessage("SDS stream refused: too many streams from this caller").Len() != 1 {
		t.Error("refusal not logged")
	}

	// Another pod is not held back by the first one's streams.
	podB := f.dial()
	for range 2 {
		f.checkCert(next(t, f.stream(podB, sdsclient.StreamConfig{Names: []string{"default"}})))
	}

	// A closed stream gives the pod its place back; its open streams still
	// get rotations.
	openA[0].Close()
	waitMetric(t, f.srv.metrics.streams, 3)
	again := f.stream(podA, sdsclient.StreamConfig{Names: []string{"default"}})
	f.checkCert(next(t, again))
	f.step(30 * time.Minute)
	f.checkCert(next(t, openA[1]))
	f.checkCert(next(t, again))
}

// TestMaxStreamsPerCallerNotAppliedToOneWorkload: without a resolver (a
// sidecar: every caller is the one workload) only MaxStreams bounds the
// streams.
func TestMaxStreamsPerCallerNotAppliedToOneWorkload(t *testing.T) {
	f := newFixture(t, fixtureOpts{config: func(c *Config) { c.MaxStreams = 3; c.MaxStreamsPerCaller = 1 }})
	c := f.dial()
	for range 3 {
		f.checkCert(next(t, f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})))
	}
	code, msg := ended(t, f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}}))
	if code != codes.ResourceExhausted || !strings.Contains(msg, "at most 3 are served at once (MESHAGENT_SDS_MAX_STREAMS)") {
		t.Fatalf("fourth stream ended with %v %q, want ResourceExhausted naming MaxStreams", code, msg)
	}
}
