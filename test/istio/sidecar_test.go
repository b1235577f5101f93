package istio

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/istiod"
)

// TestSidecarCertificateFromIstiod: the sidecar shape with istiod as its
// CA. The agent asks the API server for a token of the pod's service
// account bound to the pod (audience istio-ca), istiod reviews it and signs
// the workload's CSR; the agent serves the certificate as "default" and
// istiod's published root as ROOTCA, and is ready and live as documented.
func TestSidecarCertificateFromIstiod(t *testing.T) {
	w := newWorkload(t, "web", "node-a")
	issuedBefore := istiodIssued(t, w.ca)
	a := w.startSidecar(t, "MESHAGENT_XDS_PROXY=false")
	a.waitReady(t, 60*time.Second)

	resp := a.fetch(t, "default", "ROOTCA")
	chain, key, ok := resp.Cert("default")
	if !ok || len(key) == 0 {
		t.Fatalf("default: no certificate and key: %v", resp.Names)
	}
	rootca, ok := resp.TrustedCA("ROOTCA")
	if !ok {
		t.Fatalf("ROOTCA: no trusted CA: %v", resp.Names)
	}
	if !bytes.Equal(bytes.TrimSpace(rootca), bytes.TrimSpace(w.root)) {
		t.Fatalf("ROOTCA is not istiod's published root:\n%s\nwant\n%s", rootca, w.root)
	}
	leaf := verifyChain(t, chain, w.root, w.id())
	// istiod's own certificates: its default lifetime is 24 h, backdated.
	if life := leaf.NotAfter.Sub(time.Now()); life < 23*time.Hour || life > 25*time.Hour {
		t.Errorf("leaf lives %v more, want istiod's 24 h", life)
	}
	if got := istiodIssued(t, w.ca); got <= issuedBefore {
		t.Errorf("istiod's issuance count %v -> %v: the certificate did not come from istiod", issuedBefore, got)
	}
	if code, body := a.get("/healthz/live"); code != http.StatusOK {
		t.Errorf("/healthz/live: %d %s", code, body)
	}
}

// TestSidecarRefusedWithoutPodToken: istiod refuses a token whose audience
// is not istio-ca, and the agent says so in readiness instead of serving
// anything.
func TestSidecarRefusedWithoutPodToken(t *testing.T) {
	w := newWorkload(t, "web", "node-a")
	a := w.startSidecar(t, "MESHAGENT_XDS_PROXY=false", "CREDENTIAL_IDENTITY_PROVIDER=not-istio")
	testwait.Within(t, 20*time.Second, "a CA refusal logged", func() bool {
		if code, _ := a.get("/healthz/ready"); code == http.StatusOK {
			t.Fatal("agent ready with a token of the wrong audience")
		}
		return istiodRefused(a.Logs())
	})
}

var refusedRE = regexp.MustCompile(`Unauthenticated|PermissionDenied`)

func istiodRefused(logs string) bool { return refusedRE.MatchString(logs) }

var issuedRE = regexp.MustCompile(`(?m)^citadel_server_success_cert_issuance_count(?:\{[^}]*\})? ([0-9.e+]+)$`)

// istiodIssued is istiod's count of certificates issued, from its /metrics.
func istiodIssued(t *testing.T, ca *istiod.Istiod) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ca.MonitoringAddr+"/metrics", nil)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := issuedRE.FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
