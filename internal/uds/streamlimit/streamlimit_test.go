package streamlimit

import (
	"errors"
	"testing"
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
