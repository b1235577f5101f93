package podcert

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/kubeclient"
)

func TestPlanLifetime(t *testing.T) {
	tests := []struct {
		name                  string
		ttl, maxExp, backdate time.Duration
		want, ask             time.Duration
	}{
		{"the TTL within the maximum", 12 * time.Hour, 24 * time.Hour, time.Minute, 12 * time.Hour, 12*time.Hour - time.Minute},
		{"capped at the request's maximum", 48 * time.Hour, 24 * time.Hour, time.Minute, 24 * time.Hour, 24*time.Hour - time.Minute},
		{"raised to the API's hour", 10 * time.Minute, 24 * time.Hour, time.Minute, time.Hour, 59 * time.Minute},
		{"the shortest request", 24 * time.Hour, time.Hour, 2 * time.Minute, time.Hour, 58 * time.Minute},
		{"no maximum given: the API's default", 48 * time.Hour, 0, 0, DefaultMaxExpiration, DefaultMaxExpiration},
		{"a CA that postdates is not trusted to", time.Hour, time.Hour, -time.Minute, time.Hour, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planLifetime(tt.ttl, tt.maxExp, tt.backdate)
			if got.want != tt.want || got.ask != tt.ask {
				t.Errorf("planLifetime = %+v, want want=%s ask=%s", got, tt.want, tt.ask)
			}
		})
	}
}

func TestLifetimeCheck(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		nb, na   time.Time
		maxExp   time.Duration
		wantErr  error
		wantPass bool
	}{
		{"exactly the maximum", now.Add(-time.Minute), now.Add(59 * time.Minute), time.Hour, nil, true},
		{"a second too long", now.Add(-time.Minute), now.Add(59*time.Minute + time.Second), time.Hour, errTooLong, false},
		{"shorter than an hour", now.Add(-time.Minute), now.Add(58 * time.Minute), 24 * time.Hour, errTooShort, false},
		{"backdated past the API's five minutes", now.Add(-6 * time.Minute), now.Add(time.Hour), 24 * time.Hour, errSkewed, false},
		{"postdated past five minutes", now.Add(6 * time.Minute), now.Add(2 * time.Hour), 24 * time.Hour, errSkewed, false},
		{"default maximum", now, now.Add(24 * time.Hour), 0, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := lifetimeCheck(tt.nb, tt.na, tt.maxExp, now)
			if tt.wantPass != (err == nil) || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Errorf("lifetimeCheck: %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestBeginRefreshAt(t *testing.T) {
	nb := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name          string
		life          time.Duration
		ratio, jitter float64
		u             float64
		want          time.Duration // after nb
	}{
		{"half the life left", 24 * time.Hour, 0.5, 0, 0.3, 12 * time.Hour},
		{"jitter at its low end", 24 * time.Hour, 0.5, 0.01, 0, 12*time.Hour - 864*time.Second},
		{"jitter at its high end", 24 * time.Hour, 0.5, 0.01, 1, 12*time.Hour + 864*time.Second},
		{"kept ten minutes after NotBefore", time.Hour, 0.99, 0, 0.5, 10 * time.Minute},
		{"kept ten minutes before NotAfter", time.Hour, 0.01, 0, 0.5, 50 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := beginRefreshAt(nb, nb.Add(tt.life), tt.ratio, tt.jitter, tt.u)
			if got.Sub(nb) != tt.want {
				t.Errorf("beginRefreshAt at +%s, want +%s", got.Sub(nb), tt.want)
			}
		})
	}
}

func TestKeyTypes(t *testing.T) {
	ec := func(c elliptic.Curve) any {
		k, err := ecdsa.GenerateKey(c, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return &k.PublicKey
	}
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		pub  any
		name string
		ok   bool
	}{
		{ec(elliptic.P256()), "ECDSAP256", true},
		{ec(elliptic.P384()), "ECDSAP384", true},
		{ec(elliptic.P521()), "ECDSAP521", false},
		{edPub, "ED25519", false},
		{&rsaKey.PublicKey, "RSA2048", false},
	}
	for _, tt := range tests {
		name, ok := keyTypeSupported(tt.pub)
		if name != tt.name || ok != tt.ok {
			t.Errorf("keyTypeSupported = %s %v, want %s %v", name, ok, tt.name, tt.ok)
		}
	}
}

func TestStubEmpty(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("spiffe://cluster.local/ns/a/sa/b")
	for _, tt := range []struct {
		name string
		tmpl x509.CertificateRequest
		want bool
	}{
		{"the kubelet's stub", x509.CertificateRequest{}, true},
		{"a common name", x509.CertificateRequest{Subject: pkix.Name{CommonName: "x"}}, false},
		{"a URI SAN", x509.CertificateRequest{URIs: []*url.URL{u}}, false},
		{"a DNS SAN", x509.CertificateRequest{DNSNames: []string{"a.example"}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			der, err := x509.CreateCertificateRequest(rand.Reader, &tt.tmpl, key)
			if err != nil {
				t.Fatal(err)
			}
			csr, err := x509.ParseCertificateRequest(der)
			if err != nil {
				t.Fatal(err)
			}
			if got := stubEmpty(csr); got != tt.want {
				t.Errorf("stubEmpty = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSignerNames(t *testing.T) {
	for name, ok := range map[string]bool{
		"meshagent.io/workload-identity": true,
		"example.com/a/b":                true,
		"meshagent.io":                   false,
		"/x":                             false,
		"kubernetes.io/x":                false,
		"foo.kubernetes.io/x":            false,
	} {
		if err := ValidateSignerName(name); (err == nil) != ok {
			t.Errorf("ValidateSignerName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
	if got := BundleName("meshagent.io/workload-identity"); got != "meshagent.io:workload-identity:mesh-roots" {
		t.Errorf("BundleName = %q", got)
	}
}

// FuzzCheckSpec: whatever a request carries (the stub CSR and the
// annotations are the pod author's and the kubelet's), the checks answer
// without panicking, and a request they accept has a signed CSR of a
// supported key type that names nothing.
func FuzzCheckSpec(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		f.Fatal(err)
	}
	named, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{"a.example"}}, key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(stub, "")
	f.Add(named, "")
	f.Add(stub, "example.com/x")
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00}, "")
	f.Fuzz(func(t *testing.T, der []byte, annotation string) {
		spec := &kubeclient.PodCertificateRequestSpec{StubPKCS10Request: der}
		if annotation != "" {
			spec.UnverifiedUserAnnotations = map[string]string{annotation: "v"}
		}
		csr, v := checkSpec("meshagent.io/workload-identity", spec)
		if v.condition != "" {
			if v.condition != kubeclient.PodCertificateRequestDenied || v.reason == "" || v.message == "" {
				t.Fatalf("verdict %+v", v)
			}
			return
		}
		if csr == nil || annotation != "" || !stubEmpty(csr) {
			t.Fatalf("accepted %x with annotation %q", der, annotation)
		}
		if _, ok := keyTypeSupported(csr.PublicKey); !ok {
			t.Fatalf("accepted a key of type %T", csr.PublicKey)
		}
	})
}
