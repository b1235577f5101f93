package peerpidfd

import "context"

type ctxKey struct{}

// NewContext returns ctx carrying fd, a pidfd of the connecting process.
// The fd is borrowed: whoever reads it does not close it.
func NewContext(ctx context.Context, fd int) context.Context {
	return context.WithValue(ctx, ctxKey{}, fd)
}

// FromContext returns the pidfd ctx carries, if any.
func FromContext(ctx context.Context) (int, bool) {
	fd, ok := ctx.Value(ctxKey{}).(int)
	return fd, ok && fd >= 0
}
