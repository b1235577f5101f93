package trust

import "context"

// Watched is a bundle that changes: the roots the agent reads from a file
// (a root file's feed). PEM returns the current bundle; Watch subscribes to
// changes (signals merge) and returns the function that ends the
// subscription.
type Watched interface {
	PEM() []byte
	Watch() (<-chan struct{}, func())
}

// FollowSource hands every bundle of a Watched to a Sink: it brings the root
// files into the merge.
type FollowSource struct {
	name string
	in   Watched
	sink Sink
}

// Follow returns a source named name (e.g. "file:<path>") that follows in.
func Follow(name string, in Watched, sink Sink) *FollowSource {
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
		_ = f.sink.Update(f.name, f.in.PEM()) // a refusal is logged and counted by the sink
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
