package trust

import (
	"context"

	"github.com/meshagent/meshagent/internal/pki"
)

// Watched is a bundle that changes: the roots the agent reads from a file
// (*secretmanager.Roots of a root file's feed). Bundle returns the current
// bundle and where it came from; Watch subscribes to changes (signals
// merge) and returns the function that ends the subscription.
type Watched interface {
	Bundle() (*pki.Bundle, string)
	Watch() (<-chan struct{}, func())
}

// FollowSource hands every bundle of a Watched to a Sink: it brings the root
// files into the merge.
type FollowSource struct {
	name string
	in   Watched
	sink *Merger
}

// Follow returns a source named name (e.g. "file:<path>") that follows in.
func Follow(name string, in Watched, sink *Merger) *FollowSource {
	return &FollowSource{name: name, in: in, sink: sink}
}

// Name is the source's name.
func (f *FollowSource) Name() string { return f.name }

// Run hands the current bundle, and each new one, to the sink until ctx
// ends, and returns nil.
func (f *FollowSource) Run(ctx context.Context) error {
	changed, stop := f.in.Watch()
	defer stop()
	for {
		b, _ := f.in.Bundle()
		_ = f.sink.UpdateBundle(f.name, b) // a refusal is logged and counted by the merger
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
