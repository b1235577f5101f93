package linkerd_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/test/linkerdca"
)

func TestPreconnectDialsBeforeTheFirstSign(t *testing.T) {
	var dials atomic.Int32
	dialled := make(chan struct{}, 1)
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) {
		c.Transport.DialOptions = append(c.Transport.DialOptions, grpc.WithContextDialer(
			func(ctx context.Context, addr string) (net.Conn, error) {
				dials.Add(1)
				select {
				case dialled <- struct{}{}:
				default:
				}
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			}))
	})
	e.c.Preconnect()
	select {
	case <-dialled:
	case <-time.After(10 * time.Second):
		t.Fatal("Preconnect did not dial the identity service within 10s")
	}
	if n := len(e.s.Requests()); n != 0 {
		t.Fatalf("identity service saw %d requests after Preconnect, want 0", n)
	}
	if _, err := e.sign(t); err != nil {
		t.Fatalf("Sign after Preconnect: %v", err)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for Preconnect and one Sign, want 1", n)
	}
}

func TestPreconnectAfterCloseDoesNotDial(t *testing.T) {
	var dials atomic.Int32
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) {
		c.Transport.DialOptions = append(c.Transport.DialOptions, grpc.WithContextDialer(
			func(ctx context.Context, addr string) (net.Conn, error) {
				dials.Add(1)
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			}))
	})
	if err := e.c.Close(); err != nil {
		t.Fatal(err)
	}
	e.c.Preconnect()
	if n := dials.Load(); n != 0 {
		t.Fatalf("%d dials after Close, want 0", n)
	}
}
