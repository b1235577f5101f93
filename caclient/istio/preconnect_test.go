package istio

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/meshagent/meshagent/test/istioca"
)

// waitReady waits until c's connection is ready, failing after the test's
// deadline share. It never sends an RPC.
func waitReady(t *testing.T, c *Client) {
	t.Helper()
	conn := c.conn.Current()
	if conn == nil {
		t.Fatal("no connection after Preconnect")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("connection still %v after 10s", s)
		}
	}
}

func TestPreconnectHandshakesBeforeTheFirstSign(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	e.client.Preconnect()
	waitReady(t, e.client)
	if n := e.ca.Requests(); n != 0 {
		t.Fatalf("CA saw %d requests after Preconnect, want 0", n)
	}
	c := e.client.conn.Current()

	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatalf("Sign after Preconnect: %v", err)
	}
	if e.client.conn.Current() != c {
		t.Fatal("Sign made a second connection instead of using the preconnected one")
	}
	if n := e.ca.Requests(); n != 1 {
		t.Fatalf("CA saw %d requests, want 1", n)
	}
}

func TestPreconnectToAStoppedCALeavesTheErrorToSign(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	e.ca.Stop()
	e.client.Preconnect()
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err == nil {
		t.Fatal("Sign to a stopped CA succeeded")
	}
}

func TestPreconnectAfterCloseDoesNothing(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	if err := e.client.Close(); err != nil {
		t.Fatal(err)
	}
	e.client.Preconnect()
	if e.client.conn.Current() != nil {
		t.Fatal("Preconnect after Close made a connection")
	}
}
