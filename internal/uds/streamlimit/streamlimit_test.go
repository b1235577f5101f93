package streamlimit

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

func TestLimit(t *testing.T) {
	l := &Limit{Max: 3, PerCaller: 2}
	a1, err := l.Acquire("pod:a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire("pod:a"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire("pod:a"); !errors.Is(err, ErrPerCaller) {
		t.Fatalf("third stream of one caller: %v, want ErrPerCaller", err)
	}
	if _, err := l.Acquire(""); err != nil {
		t.Fatalf("unkeyed stream under Max: %v", err)
	}
	if _, err := l.Acquire("pod:b"); !errors.Is(err, ErrTotal) {
		t.Fatalf("stream over Max: %v, want ErrTotal", err)
	}
	a1()
	if _, err := l.Acquire("pod:b"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := l.Acquire("pod:a"); !errors.Is(err, ErrTotal) {
		t.Fatalf("full again: %v, want ErrTotal", err)
	}
	if len(l.own.per) != 2 || l.own.per["pod:a"] != 1 || l.own.per["pod:b"] != 1 {
		t.Fatalf("per-caller counts %v", l.own.per)
	}
}

func TestReleasedCallerIsForgotten(t *testing.T) {
	l := &Limit{Max: 10, PerCaller: 1}
	release, err := l.Acquire("pod:a")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if len(l.own.per) != 0 || l.open != 0 {
		t.Fatalf("after release: open %d, per %v", l.open, l.own.per)
	}
}

// Two Limits sharing Callers count one caller's streams together, each
// within its own Max.
func TestSharedCallers(t *testing.T) {
	var callers Callers
	sds := &Limit{Max: 10, PerCaller: 3, Callers: &callers}
	wl := &Limit{Max: 10, PerCaller: 3, Callers: &callers}
	for _, l := range []*Limit{sds, sds, wl} {
		if _, err := l.Acquire("pod:a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := wl.Acquire("pod:a"); !errors.Is(err, ErrPerCaller) {
		t.Fatalf("fourth stream of one pod across both: %v, want ErrPerCaller", err)
	}
	if _, err := sds.Acquire("pod:b"); err != nil {
		t.Fatalf("another pod: %v", err)
	}
	if wl.open != 1 || sds.open != 3 {
		t.Fatalf("open: workload API %d, SDS %d", wl.open, sds.open)
	}
}

// Admit names the limit a stream hit and the setting that raises it, with
// the code a gRPC client backs off on; the caller is the one on ctx.
func TestAdmitRefusals(t *testing.T) {
	t.Parallel()
	l := &Limit{Max: 2, PerCaller: 1, Service: "SDS", Names: Names{Max: "MESHAGENT_SDS_MAX_STREAMS", PerCaller: "MESHAGENT_SDS_MAX_STREAMS_PER_POD"}}
	pod := caller.NewContext(context.Background(), caller.Info{PodUID: "uid-1"})
	release, r, err := l.Admit(pod)
	if err != nil || r != (Refusal{}) {
		t.Fatalf("first stream: %v, %+v", err, r)
	}
	defer release()
	_, r, err = l.Admit(pod)
	if status.Code(err) != codes.ResourceExhausted || r.Reason != ReasonMaxStreamsPerCaller || r.Limit != 1 || !errors.Is(r.Cause, ErrPerCaller) ||
		!strings.Contains(err.Error(), "at most 1 SDS and Workload API streams are served at once (MESHAGENT_SDS_MAX_STREAMS_PER_POD)") {
		t.Fatalf("a pod's second stream: %v, %+v", err, r)
	}
	release2, _, err := l.Admit(context.Background()) // a sidecar's caller: no key
	if err != nil {
		t.Fatal(err)
	}
	defer release2()
	_, r, err = l.Admit(context.Background())
	if status.Code(err) != codes.ResourceExhausted || r.Reason != ReasonMaxStreams || r.Limit != 2 || !errors.Is(r.Cause, ErrTotal) ||
		!strings.Contains(err.Error(), "too many SDS streams: at most 2 are served at once (MESHAGENT_SDS_MAX_STREAMS)") {
		t.Fatalf("a third stream: %v, %+v", err, r)
	}
}
