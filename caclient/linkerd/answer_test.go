package linkerd

import (
	"encoding/pem"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/meshagent/meshagent/caclient/linkerd/identitypb"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// goodAnswer is a well-formed answer from a fresh CA.
func goodAnswer(tb testing.TB) *identitypb.CertifyResponse {
	tb.Helper()
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		tb.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		tb.Fatal(err)
	}
	chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: pki.Identity{DNSName: "web.default.serviceaccount.identity.linkerd.cluster.local"}, TTL: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	return &identitypb.CertifyResponse{
		LeafCertificate:          chain[0].Raw,
		IntermediateCertificates: [][]byte{chain[1].Raw},
		ValidUntil:               timestamppb.New(chain[0].NotAfter),
	}
}

func TestParseAnswer(t *testing.T) {
	good := goodAnswer(t)
	tests := []struct {
		name    string
		resp    *identitypb.CertifyResponse
		certs   int
		wantErr bool
	}{
		{"good", good, 2, false},
		{"leaf only", &identitypb.CertifyResponse{LeafCertificate: good.LeafCertificate}, 1, false},
		{"nil", nil, 0, true},
		{"no leaf", &identitypb.CertifyResponse{IntermediateCertificates: good.IntermediateCertificates}, 0, true},
		{"leaf not DER", &identitypb.CertifyResponse{LeafCertificate: []byte("junk")}, 0, true},
		{"leaf in PEM", &identitypb.CertifyResponse{LeafCertificate: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: good.LeafCertificate})}, 0, true},
		{"empty intermediate", &identitypb.CertifyResponse{LeafCertificate: good.LeafCertificate, IntermediateCertificates: [][]byte{nil}}, 0, true},
		{"intermediate not DER", &identitypb.CertifyResponse{LeafCertificate: good.LeafCertificate, IntermediateCertificates: [][]byte{[]byte("junk")}}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chain, err := parseAnswer(tt.resp)
			if tt.wantErr {
				if !errors.Is(err, ErrMalformedAnswer) {
					t.Fatalf("error %v, want ErrMalformedAnswer", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(chain) != tt.certs {
				t.Fatalf("%d certificates, want %d", len(chain), tt.certs)
			}
		})
	}
}

func TestCheckValidUntil(t *testing.T) {
	good := goodAnswer(t)
	leaf, err := parseAnswer(good)
	if err != nil {
		t.Fatal(err)
	}
	na := leaf[0].NotAfter
	tests := []struct {
		name string
		ts   *timestamppb.Timestamp
		want string
	}{
		{"equal", timestamppb.New(na), ""},
		{"within tolerance", timestamppb.New(na.Add(-30 * time.Second)), ""},
		{"missing", nil, warnValidUntilMissing},
		{"invalid", &timestamppb.Timestamp{Seconds: 1, Nanos: -5}, warnValidUntilInvalid},
		{"an hour later", timestamppb.New(na.Add(time.Hour)), warnValidUntilMismatch},
		{"an hour earlier", timestamppb.New(na.Add(-time.Hour)), warnValidUntilMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := proto.Clone(good).(*identitypb.CertifyResponse)
			resp.ValidUntil = tt.ts
			if got, _ := checkValidUntil(resp, leaf[0]); got != tt.want {
				t.Fatalf("reason %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzParseAnswer feeds arbitrary bytes, as an identity service could send,
// through the answer decoding: never a panic, and anything accepted is a
// chain of parsed certificates whose leaf is the answer's leaf.
func FuzzParseAnswer(f *testing.F) {
	good := goodAnswer(f)
	for _, r := range []*identitypb.CertifyResponse{
		good,
		{LeafCertificate: good.LeafCertificate},
		{LeafCertificate: []byte("junk"), ValidUntil: &timestamppb.Timestamp{Seconds: -1 << 62}},
		{LeafCertificate: good.LeafCertificate, IntermediateCertificates: [][]byte{nil, good.LeafCertificate}},
		{ValidUntil: &timestamppb.Timestamp{Nanos: 2e9}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var resp identitypb.CertifyResponse
		if err := proto.Unmarshal(data, &resp); err != nil {
			return
		}
		chain, err := parseAnswer(&resp)
		if err != nil {
			if !errors.Is(err, ErrMalformedAnswer) {
				t.Fatalf("error %v does not wrap ErrMalformedAnswer", err)
			}
			return
		}
		if len(chain) != 1+len(resp.GetIntermediateCertificates()) {
			t.Fatalf("%d certificates from %d intermediates", len(chain), len(resp.GetIntermediateCertificates()))
		}
		if string(chain[0].Raw) != string(resp.GetLeafCertificate()) {
			t.Fatal("leaf is not the answer's leaf")
		}
		_, _ = checkValidUntil(&resp, chain[0])
	})
}
