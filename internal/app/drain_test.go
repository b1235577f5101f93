package app

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/settings"
)

// TestDrainPeriod: beside an Envoy the drain is PROXY_CONFIG's
// terminationDrainDuration (Istio's 5s by default); the node agent and
// DISABLE_ENVOY do not drain.
func TestDrainPeriod(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  []string
		want time.Duration
	}{
		{"sidecar default", nil, 5 * time.Second},
		{"sidecar set", []string{`PROXY_CONFIG={"terminationDrainDuration":"45s"}`}, 45 * time.Second},
		{"sidecar none", []string{`PROXY_CONFIG={"terminationDrainDuration":"0s"}`}, 0},
		{"node", []string{`PROXY_CONFIG={"terminationDrainDuration":"45s"}`, "MESHAGENT_MODE=node", "NODE_NAME=n1"}, 0},
		{"no Envoy", []string{`PROXY_CONFIG={"terminationDrainDuration":"45s"}`, "DISABLE_ENVOY=true"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := settings.Resolve(settings.Input{Env: tt.env})
			if err != nil {
				t.Fatal(err)
			}
			if got := (&App{s: s}).DrainPeriod(); got != tt.want {
				t.Errorf("DrainPeriod %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStartDrainFailsReadiness: from StartDrain on, /healthz/ready answers
// 503 naming the drain; liveness is untouched.
func TestStartDrainFailsReadiness(t *testing.T) {
	dir := t.TempDir()
	r := startApp(t, Config{}, caSettings(t, dir, "127.0.0.1:1"))
	get := func(path string) (int, string) {
		resp, err := http.Get(r.status + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if _, body := get("/healthz/ready"); strings.Contains(body, "draining") {
		t.Fatalf("draining before StartDrain: %q", body)
	}
	r.app.StartDrain()
	if code, body := get("/healthz/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining: the agent is stopping") {
		t.Errorf("ready after StartDrain: %d %q", code, body)
	}
	if code, body := get("/healthz/live"); code != http.StatusOK {
		t.Errorf("live after StartDrain: %d %q", code, body)
	}
}
