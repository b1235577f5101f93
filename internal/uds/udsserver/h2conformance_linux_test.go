package udsserver

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

// The HTTP/2 the server writes itself, checked against grpc-go's own
// client at the version in go.mod: a refusal's answer (tell: the server's
// SETTINGS, its acknowledgement of the client's, a trailers-only response
// to the first call, a GOAWAY) must read, to grpc-go's client, as the
// status it carries, for a unary call and a stream alike, with the
// message intact (percent-encoded where needed); and a refused connection
// on which no call comes must end, not be taken as ready. Parking's
// SETTINGS are checked against gRPC's server in
// TestParkedConnectionHandsOffAtAnyFrame. A grpc-go upgrade that changes
// what these rely on fails here.
func TestHandWrittenHTTP2Conformance(t *testing.T) {
	const reason = "the connecting process has exited: 100% gone, é"
	f := start(t, func(c *Config) {
		c.Resolver = podsByUID{resolve: func(context.Context, caller.Cred) (caller.Info, error) {
			return caller.Info{}, refusal{msg: reason}
		}}
		c.MaxConnRatePerCaller = 1000
	})
	want := "caller not identified: " + reason
	check := func(what string, err error) {
		t.Helper()
		st := status.Convert(err)
		if st.Code() != codes.PermissionDenied || st.Message() != want {
			t.Fatalf("%s: %v, want PermissionDenied %q", what, err, want)
		}
	}
	_, err := unary(t, f.dial())
	check("unary", err)

	s, err := f.dial().NewStream(rpcCtx(t), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, whoStream, grpc.WaitForReady(true))
	if err == nil {
		if err = s.SendMsg(wrapperspb.String("who")); err == nil || err == io.EOF {
			var out wrapperspb.StringValue
			err = s.RecvMsg(&out)
		}
	}
	check("stream", err)

	// No call: the connection is told by GOAWAY and closed; grpc-go's
	// client does not stay ready on it.
	cc := f.dial()
	cc.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sawReady := false
	for st := cc.GetState(); ; st = cc.GetState() {
		if st == connectivity.Ready {
			sawReady = true
		}
		if sawReady && st != connectivity.Ready {
			break // it was let go
		}
		if st == connectivity.TransientFailure && !sawReady {
			break // refused before it was ready
		}
		if !cc.WaitForStateChange(ctx, st) {
			t.Fatalf("a refused connection without a call: still %v", st)
		}
	}
	if n := f.connsOf(uidKey(me())); n != 0 {
		t.Errorf("%d refused connections counted, want none", n)
	}
}
