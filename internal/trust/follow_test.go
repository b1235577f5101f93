package trust

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/secret"
)

// A followed root file's bundle enters the merge parsed as it is, and each
// change of it replaces its part; an empty bundle is refused and its last
// good roots stay.
func TestFollowBringsRootFilesIntoTheMerge(t *testing.T) {
	roots, err := secret.NewRoots(newRoot(t, "a"), "/r.pem")
	if err != nil {
		t.Fatal(err)
	}
	pub := newPublisher()
	m, err := NewMerger(MergerConfig{Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Update("configmap:ns/cm/root-cert.pem", newRoot(t, "c")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Follow("file:/r.pem", roots, m).Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitSubjects := func(want ...string) {
		t.Helper()
		for {
			if got := subjects(t, pub.last()); slices.Equal(got, want) {
				return
			}
			select {
			case <-pub.changed:
			case <-time.After(10 * time.Second):
				t.Fatalf("merged roots %v, want %v", subjects(t, pub.last()), want)
			}
		}
	}
	waitSubjects("c", "a")
	if err := roots.Set(newRoot(t, "b"), "/r.pem"); err != nil {
		t.Fatal(err)
	}
	waitSubjects("c", "b")

	n := pub.count()
	if err := m.UpdateBundle("file:/r.pem", nil); err == nil {
		t.Fatal("an empty bundle was taken")
	}
	if pub.count() != n || !slices.Equal(subjects(t, pub.last()), []string{"c", "b"}) {
		t.Errorf("after a refused bundle: %d publications (was %d), roots %v", pub.count(), n, subjects(t, pub.last()))
	}
}
