package secretmanager

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshagent/meshagent/internal/secret"
)

// The scheduler on the bubble's clock (testing/synctest): the certificate
// is renewed at its RenewAt exactly, not a second before, with no fake
// clock to step and no real time spent. A manager does no I/O of its own
// and the test CA signs in memory, so the whole run fits in a bubble.
func TestRenewalAtRenewAtInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t, time.Now)
		roots, err := secret.NewRoots(ca.ca.RootPEM(), "test")
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(Config{Identity: testID, CA: ca, Roots: roots, TTL: time.Hour, Rand: func() float64 { return 0.5 }, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		changed, unwatch := m.Watch(own, WorkloadCertName)
		defer unwatch()
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		defer func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run returned %v", err)
			}
		}()

		first, err := m.Secret(ctx, own, WorkloadCertName)
		if err != nil {
			t.Fatal(err)
		}
		<-changed // the first certificate's signal
		if d := first.RenewAt.Sub(time.Now()); d < 29*time.Minute || d > 31*time.Minute {
			t.Fatalf("renewal due in %v, want half the 1h life ±1%%", d)
		}

		time.Sleep(time.Until(first.RenewAt) - time.Second)
		synctest.Wait() // everything the manager would do now is done
		select {
		case <-changed:
			t.Fatalf("renewed a second before RenewAt (%d CA requests)", ca.count())
		default:
		}
		if n := ca.count(); n != 1 {
			t.Fatalf("%d CA requests before RenewAt, want 1", n)
		}

		time.Sleep(time.Second)
		synctest.Wait()
		select {
		case <-changed:
		default:
			t.Fatalf("not renewed at RenewAt (%d CA requests)", ca.count())
		}
		second, err := m.Current(own, WorkloadCertName)
		if err != nil || second.Version <= first.Version || second.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
			t.Fatalf("after RenewAt: %v, version %d after %d", err, second.Version, first.Version)
		}
	})
}
