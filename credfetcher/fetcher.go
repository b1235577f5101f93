package credfetcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrNoToken is returned when no token is available from the configured place.
var ErrNoToken = errors.New("no token available")

// Fetcher returns a bearer token.
type Fetcher interface {
	Token(ctx context.Context) (string, error)
}

// File reads the token from a file on every call (the projected service-account
// token of JWT_POLICY=third-party-jwt, rotated in place by the kubelet).
type File struct {
	Path string
}

// Token reads and trims the token file.
func (f File) Token(context.Context) (string, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%w: token file %s does not exist", ErrNoToken, f.Path)
		}
		return "", fmt.Errorf("reading token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%w: token file %s is empty", ErrNoToken, f.Path)
	}
	if strings.ContainsAny(tok, "\r\n\t ") {
		return "", fmt.Errorf("token file %s holds more than one token or stray white space", f.Path)
	}
	return tok, nil
}

// Invalidator is implemented by fetchers that keep a token between calls. A
// client whose peer refused a token (gRPC Unauthenticated) calls Invalidate
// with that token, so the next Token returns a new one.
type Invalidator interface {
	Invalidate(token string)
}

// Refused tells f, when it keeps tokens, that a peer refused token.
func Refused(f Fetcher, token string) {
	if inv, ok := f.(Invalidator); ok {
		inv.Invalidate(token)
	}
}
