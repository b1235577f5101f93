package podresolver

import "context"

type pidfdKey struct{}

// WithPIDFD returns ctx carrying a pidfd of the connecting process, read from
// the connection when it was accepted (PeerPIDFD). Resolve then checks the
// process it reads is that one, which closes the window between connect()
// and Resolve (see doc.go). The fd is borrowed: the caller closes it after
// Resolve returns.
func WithPIDFD(ctx context.Context, fd int) context.Context {
	return context.WithValue(ctx, pidfdKey{}, fd)
}

func pidfdFromContext(ctx context.Context) (int, bool) {
	fd, ok := ctx.Value(pidfdKey{}).(int)
	return fd, ok && fd >= 0
}
