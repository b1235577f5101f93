package workloadapi

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
)

// The security header is accepted exactly when the metadata carries one
// workload.spiffe.io entry whose value is "true", whatever else is sent.
func FuzzSecurityHeader(f *testing.F) {
	f.Add("true", "", false)
	f.Add("true", "true", true)
	f.Add("TRUE", "", false)
	f.Add("", "", false)
	f.Add("true ", "x", true)
	s, err := New(Config{Secrets: nopSource{}, MaxStreams: 4096, MaxStreamsPerCaller: 64})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, first, second string, both bool) {
		md := metadata.MD{}
		md.Append(headerKey, first)
		if both {
			md.Append(headerKey, second)
		}
		md.Append("other", second)
		err := s.checkHeader(metadata.NewIncomingContext(context.Background(), md), "Fuzz")
		want := !both && first == "true"
		if (err == nil) != want {
			t.Fatalf("header %q (second %q, sent %v): %v", first, second, both, err)
		}
		if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("refused with %v, want InvalidArgument", status.Code(err))
		}
	})
}

// nopSource serves nothing: the header is checked before any secret is read.
type nopSource struct{}

func (nopSource) Secret(context.Context, pki.Identity, string) (*secretmanager.Secret, error) {
	return nil, secretmanager.ErrUnknownResource
}

func (nopSource) Watch(pki.Identity, string) (<-chan struct{}, func()) { return nil, func() {} }
