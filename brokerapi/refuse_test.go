package brokerapi

import (
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	clocktesting "k8s.io/utils/clock/testing"
)

// Refusals are logged at a bounded rate: a burst, then one line a second
// saying how many were left out.
func TestRefusalLogBounded(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	l := newRefusalLog(zap.New(core), clk)
	r := &refusal{reason: refusedNotBroker, code: codes.PermissionDenied, msg: "not an allowed broker"}
	for range 1000 {
		l.note(methodX509SVID, spiffeid.ID{}, r)
	}
	if got := logs.Len(); got != refusalLogBurst {
		t.Fatalf("%d lines for 1000 refusals at once, want %d", got, refusalLogBurst)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	l.note(methodX509SVID, spiffeid.ID{}, r)
	all := logs.All()
	if len(all) != refusalLogBurst+1 {
		t.Fatalf("%d lines a second later, want %d", len(all), refusalLogBurst+1)
	}
	if got := all[len(all)-1].ContextMap()["suppressed"]; got != int64(1000-refusalLogBurst) {
		t.Fatalf("suppressed = %v, want %d", got, 1000-refusalLogBurst)
	}
}
