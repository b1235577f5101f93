package main

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/istioca"
)

func TestCABudget(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var csrs []istioca.CSRRecord
	// Identity a: one every 15 s for 3 minutes (4 per minute), plus a
	// burst of 6 in one second at 100 s.
	for d := time.Duration(0); d < 3*time.Minute; d += 15 * time.Second {
		csrs = append(csrs, istioca.CSRRecord{At: at(d), Identity: "a"})
	}
	for i := range 6 {
		csrs = append(csrs, istioca.CSRRecord{At: at(100*time.Second + time.Duration(i)*100*time.Millisecond), Identity: "a"})
	}
	// Identity b: exactly 60 s apart twice: never two in one window.
	csrs = append(csrs, istioca.CSRRecord{At: at(time.Minute), Identity: "b"}, istioca.CSRRecord{At: at(0), Identity: "b"})

	got := caBudget(csrs, time.Minute)
	if len(got) != 2 || got[0].Identity != "a" || got[1].Identity != "b" {
		t.Fatalf("identities %+v", got)
	}
	if got[0].Total != 18 || got[0].MaxPerWindow != 10 {
		t.Errorf("a: total %d, max per window %d; want 18 and 10", got[0].Total, got[0].MaxPerWindow)
	}
	if got[1].Total != 2 || got[1].MaxPerWindow != 1 {
		t.Errorf("b: total %d, max per window %d; want 2 and 1", got[1].Total, got[1].MaxPerWindow)
	}
	if len(caBudget(nil, time.Minute)) != 0 {
		t.Error("budget of no CSRs")
	}
}
