package caclient

import (
	"crypto/tls"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/controlplane"
)

// A connection is made once and reused, kept after a status the CA
// answered, made again after a transport failure retired it (a stale retire
// changes nothing), and refused after Close.
func TestConnLifecycle(t *testing.T) {
	errClosed := errors.New("closed")
	c := NewConn(controlplane.Config{Addr: "127.0.0.1:1", Plaintext: true}, errClosed)
	if c.Current() != nil {
		t.Fatal("a connection before the first Get")
	}
	first, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Get(); again != first {
		t.Fatal("a second Get dialled again")
	}
	c.Retire(first, status.Error(codes.PermissionDenied, "refused by the CA"))
	if again, _ := c.Get(); again != first {
		t.Fatal("a refusal retired the connection")
	}
	c.Retire(first, status.Error(codes.Unavailable, "connection refused"))
	second, err := c.Get()
	if err != nil || second == first {
		t.Fatalf("after Retire: %p (first %p), %v; want a new connection", second, first, err)
	}
	c.Retire(first, status.Error(codes.Unavailable, "connection refused")) // stale: second stays
	if again, _ := c.Get(); again != second {
		t.Fatal("retiring an old connection dropped the current one")
	}
	c.Preconnect()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if c.Current() != nil {
		t.Fatal("a connection after Close")
	}
	if _, err := c.Get(); !errors.Is(err, errClosed) {
		t.Fatalf("Get after Close: %v, want errClosed", err)
	}
	c.Preconnect() // closed: nothing to do
}

// With a client certificate in the transport, a refusal retires the
// connection (its handshake may have offered no certificate, one may be held
// now); without one, it does not.
func TestConnRefusalRetiresWithAClientCertificate(t *testing.T) {
	refused := status.Error(codes.Unauthenticated, "no bearer token and no client certificate")
	withCert := NewConn(controlplane.Config{Addr: "127.0.0.1:1", Plaintext: true,
		ClientCertificate: func() (*tls.Certificate, error) { return nil, errors.New("none yet") }}, errors.New("closed"))
	defer withCert.Close()
	first, err := withCert.Get()
	if err != nil {
		t.Fatal(err)
	}
	withCert.Retire(first, refused)
	if again, _ := withCert.Get(); again == first {
		t.Error("a refusal kept the connection of a transport with a client certificate")
	}
	tokenOnly := NewConn(controlplane.Config{Addr: "127.0.0.1:1", Plaintext: true}, errors.New("closed"))
	defer tokenOnly.Close()
	first, err = tokenOnly.Get()
	if err != nil {
		t.Fatal(err)
	}
	tokenOnly.Retire(first, refused)
	if again, _ := tokenOnly.Get(); again != first {
		t.Error("a refusal retired the connection of a transport without a client certificate")
	}
}
