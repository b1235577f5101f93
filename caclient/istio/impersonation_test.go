package istio

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/istioca"
)

// A node agent authenticates with its own pod-bound token and names the
// identity it asks for in ImpersonatedIdentity; the test CA reviews the
// token with the API server and applies istiod's node authorizer.
func TestImpersonationForNodeAgent(t *testing.T) {
	kube := kube.Env(t)
	ctx := context.Background()
	sys, app := fmt.Sprintf("imp-sys-%d", time.Now().UnixNano()), fmt.Sprintf("imp-app-%d", time.Now().UnixNano())
	for _, ns := range []string{sys, app} {
		if _, err := kube.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	for _, sa := range [][2]string{{sys, "meshagent"}, {app, "cart"}, {app, "far"}} {
		if _, err := kube.CreateServiceAccount(ctx, sa[0], sa[1]); err != nil {
			t.Fatal(err)
		}
	}
	agentPod, err := kube.CreatePod(ctx, sys, "meshagent-a", "meshagent", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CreatePod(ctx, app, "cart-0", "cart", "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CreatePod(ctx, app, "far-0", "far", "node-b"); err != nil {
		t.Fatal(err)
	}
	tok, err := kube.Token(ctx, sys, "meshagent", []string{istioca.DefaultAudience}, agentPod, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	own := pki.SPIFFEIdentity("cluster.local", sys, "meshagent")
	cart := pki.SPIFFEIdentity("cluster.local", app, "cart")
	far := pki.SPIFFEIdentity("cluster.local", app, "far")

	ca := istioca.Start(t, istioca.Config{Kube: kube.Client(),
		TrustedNodeAccounts: []istioca.ServiceAccount{{Namespace: sys, Name: "meshagent"}}})
	tokenPath := filepath.Join(t.TempDir(), "token")
	writeToken(t, tokenPath, tok)
	client := func(id pki.Identity) *Client {
		c, err := New(Config{
			Transport: controlplane.Config{Addr: ca.Addr(), ServerName: ca.ServerName(),
				Roots: controlplane.StaticRoots{Pool: ca.Roots()}, Token: credfetcher.File{Path: tokenPath}},
			CertSigner: "signer-a",
			Identity:   id,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	node := client(own)
	sign := func(c *Client, id pki.Identity) (pki.Identity, error) {
		_, csr := newCSR(t, id)
		chain, err := c.Sign(ctxT(t), csr, id, time.Hour)
		if err != nil {
			return pki.Identity{}, err
		}
		got, err := pki.IdentityOf(chain[0])
		if err != nil {
			t.Fatal(err)
		}
		return got, nil
	}
	impersonatedField := func() (string, bool) {
		v, ok := ca.LastRequest().GetMetadata().GetFields()[ImpersonatedIdentityKey]
		return v.GetStringValue(), ok
	}

	// A pod's identity: asked on its behalf, issued for it.
	if got, err := sign(node, cart); err != nil || got != cart {
		t.Fatalf("cart: issued %v, %v; want %v", got, err, cart)
	}
	if v, ok := impersonatedField(); !ok || v != cart.SPIFFEID {
		t.Fatalf("ImpersonatedIdentity %q (sent %v), want %q", v, ok, cart.SPIFFEID)
	}
	if v := ca.LastRequest().GetMetadata().GetFields()[CertSignerKey].GetStringValue(); v != "signer-a" {
		t.Errorf("CertSigner %q alongside the impersonation, want signer-a", v)
	}
	// Its own identity: no impersonation.
	if got, err := sign(node, own); err != nil || got != own {
		t.Fatalf("own: issued %v, %v; want %v", got, err, own)
	}
	if v, ok := impersonatedField(); ok {
		t.Fatalf("ImpersonatedIdentity %q sent for the agent's own identity", v)
	}
	// An identity with no pod on the agent's node: refused by the CA,
	// counted and explained.
	before := len(ca.Denials())
	_, err = sign(node, far)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "refused the impersonation") {
		t.Fatalf("far: %v, want Unauthenticated explained as a refused impersonation", err)
	}
	if d := ca.Denials()[before:]; len(d) != 1 || !strings.Contains(d[0], "no pod of "+app+"/far runs on node node-a") {
		t.Fatalf("CA denials %v", d)
	}
	for result, want := range map[string]float64{resultOK: 1, resultRefused: 1, resultFailed: 0} {
		if got := testutil.ToFloat64(node.metrics.impersonated.WithLabelValues(result)); got != want {
			t.Errorf("impersonated{result=%s} = %v, want %v", result, got, want)
		}
	}
	// The CA still serves the other identities.
	if got, err := sign(node, cart); err != nil || got != cart {
		t.Fatalf("cart after the refusal: %v, %v", got, err)
	}

	// Without its own identity configured the client never impersonates:
	// the CA issues only the token's identity and rejects a CSR for another.
	plain := client(pki.Identity{})
	if _, err := sign(plain, cart); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("cart without impersonation: %v, want InvalidArgument (the CSR is not the token's identity)", err)
	}
	if v, ok := impersonatedField(); ok {
		t.Fatalf("ImpersonatedIdentity %q sent by a client with no identity of its own", v)
	}
}
