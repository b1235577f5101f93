// Package brokerclient is a SPIFFE Broker API client for the project's
// tests, built from the same generated code the agent serves
// (brokerapi/brokerpb): mutual TLS with the broker's X.509-SVID, the
// agent authenticated by its SPIFFE ID, the broker.spiffe.io header on
// every call (unless a test leaves it out), and the standard's two
// reference types.
package brokerclient

import (
	"context"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/brokerapi/brokerpb"
)

// Client is a broker's connection to the agent's Broker API socket.
type Client struct {
	conn *grpc.ClientConn
	API  brokerpb.APIClient
	// NoHeader leaves the broker.spiffe.io header out of the calls.
	NoHeader bool
}

// Dial connects to the Unix socket at path as the broker whose SVID is
// svid, trusting bundle, and accepting only a server whose SVID names
// agent. It connects lazily, at the first call.
func Dial(path string, svid x509svid.Source, bundle x509bundle.Source, agent spiffeid.ID) (*Client, error) {
	tc := tlsconfig.MTLSClientConfig(svid, bundle, tlsconfig.AuthorizeID(agent))
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, fmt.Errorf("broker client: %w", err)
	}
	return &Client{conn: conn, API: brokerpb.NewAPIClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Context is ctx with the security header, unless NoHeader is set.
func (c *Client) Context(ctx context.Context) context.Context {
	if c.NoHeader {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "broker.spiffe.io", "true")
}

// SVIDs opens SubscribeToX509SVID for ref.
func (c *Client) SVIDs(ctx context.Context, ref *brokerpb.WorkloadReference) (brokerpb.API_SubscribeToX509SVIDClient, error) {
	return c.API.SubscribeToX509SVID(c.Context(ctx), &brokerpb.SubscribeToX509SVIDRequest{Reference: ref})
}

// Bundles opens SubscribeToX509Bundles for ref.
func (c *Client) Bundles(ctx context.Context, ref *brokerpb.WorkloadReference) (brokerpb.API_SubscribeToX509BundlesClient, error) {
	return c.API.SubscribeToX509Bundles(c.Context(ctx), &brokerpb.SubscribeToX509BundlesRequest{Reference: ref})
}

// FirstSVID opens SubscribeToX509SVID for ref and returns its first
// response, or the stream's error.
func (c *Client) FirstSVID(ctx context.Context, ref *brokerpb.WorkloadReference) (*brokerpb.SubscribeToX509SVIDResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.SVIDs(ctx, ref)
	if err != nil {
		return nil, err
	}
	return st.Recv()
}

// PIDRef is a WorkloadPIDReference.
func PIDRef(pid int32) *brokerpb.WorkloadReference {
	return Ref(&brokerpb.WorkloadPIDReference{Pid: pid})
}

// PodRef is a KubernetesObjectReference to a pod: by key when name is set,
// by uid when uid is set, by both when both are.
func PodRef(namespace, name, uid string) *brokerpb.WorkloadReference {
	r := &brokerpb.KubernetesObjectReference{Type: &brokerpb.KubernetesObjectType{Plural: "pods", Group: "core"}, Uid: uid}
	if name != "" {
		r.Key = &brokerpb.KubernetesObjectKey{Namespace: namespace, Name: name}
	}
	return Ref(r)
}

// Ref packs any message as a reference.
func Ref(m proto.Message) *brokerpb.WorkloadReference {
	a, err := anypb.New(m)
	if err != nil {
		panic(err) // only for messages without a descriptor: none here
	}
	return &brokerpb.WorkloadReference{Reference: a}
}

// ParseSVID is the first X509SVID of a response as go-spiffe's SVID, with
// its bundle.
func ParseSVID(resp *brokerpb.SubscribeToX509SVIDResponse) (*x509svid.SVID, *x509bundle.Bundle, error) {
	if len(resp.GetSvids()) == 0 {
		return nil, nil, fmt.Errorf("response with no SVID")
	}
	s := resp.GetSvids()[0]
	svid, err := x509svid.ParseRaw(s.GetX509Svid(), s.GetX509SvidKey())
	if err != nil {
		return nil, nil, err
	}
	if svid.ID.String() != s.GetSpiffeId() {
		return nil, nil, fmt.Errorf("spiffe_id %s, certificate names %s", s.GetSpiffeId(), svid.ID)
	}
	b, err := x509bundle.ParseRaw(svid.ID.TrustDomain(), s.GetBundle())
	if err != nil {
		return nil, nil, err
	}
	return svid, b, nil
}
