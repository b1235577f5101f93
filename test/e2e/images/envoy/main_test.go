package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// A bootstrap of the shape pilot-agent renders from Istio's template (trimmed).
const testBootstrap = `{
  "node": {"id": "sidecar~10.0.0.1~sleep-1.default~default.svc.cluster.local", "cluster": "sleep.default",
           "metadata": {"CLUSTER_ID": "Kubernetes"}, "unknown_field": 1},
  "admin": {"access_log": [{"name": "x", "typed_config": {"@type": "type.googleapis.com/unknown.Type"}}],
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}},
  "dynamic_resources": {"ads_config": {"grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]}},
  "static_resources": {
    "clusters": [
      {"name": "prometheus_stats", "load_assignment": {"endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}}}]}]}},
      {"name": "sds-grpc", "load_assignment": {"endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": "./var/run/secrets/workload-spiffe-uds/socket"}}}}]}]}},
      {"name": "xds-grpc", "load_assignment": {"endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": "./etc/istio/proxy/XDS"}}}}]}]}},
      {"name": "empty"}
    ],
    "listeners": [
      {"name": "0.0.0.0_15090", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15090}},
       "filter_chains": [{"filters": [{"typed_config": {"route_config": {"virtual_hosts": [{"routes": [
         {"match": {"prefix": "/stats/prometheus"}, "route": {"cluster": "prometheus_stats"}}]}]}}}]}]},
      {"name": "tls", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15091}},
       "filter_chains": [{"transport_socket": {"name": "tls"}}]}
    ]
  }
}`

func TestParseBootstrap(t *testing.T) {
	bs, err := parseBootstrap([]byte(testBootstrap))
	if err != nil {
		t.Fatal(err)
	}
	if bs.node.GetId() != "sidecar~10.0.0.1~sleep-1.default~default.svc.cluster.local" || bs.node.GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue() != "Kubernetes" {
		t.Errorf("node %v", bs.node)
	}
	if got := bs.Admin.Address.hostPort(); got != "127.0.0.1:15000" {
		t.Errorf("admin %q", got)
	}
	for name, want := range map[string]string{
		"sds-grpc":         "unix:./var/run/secrets/workload-spiffe-uds/socket",
		"xds-grpc":         "unix:./etc/istio/proxy/XDS",
		"prometheus_stats": "tcp:127.0.0.1:15000",
	} {
		got, err := bs.clusterAddress(name)
		if err != nil || got.String() != want {
			t.Errorf("cluster %s: %v %v, want %s", name, got, err, want)
		}
	}
	if bs.adsCluster() != "xds-grpc" {
		t.Errorf("ADS cluster %q", bs.adsCluster())
	}
	for name, want := range map[string]string{"missing": "no static cluster missing", "empty": "no endpoint address"} {
		if _, err := bs.clusterAddress(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("cluster %s: %v, want an error containing %q", name, err, want)
		}
	}
	if _, err := bs.listenerHandler(bs.StaticResources.Listeners[1]); err == nil {
		t.Error("a TLS listener was served")
	}
	if _, err := parseBootstrap([]byte(`{"node": {"id": 3}}`)); err == nil {
		t.Error("a node whose id is a number was accepted")
	}
}

func TestConfigPath(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-c", "etc/istio/proxy/envoy-rev.json", "--drain-time-s", "45"}, "etc/istio/proxy/envoy-rev.json"},
		{[]string{"--disable-hot-restart", "--config-path", "/b.json"}, "/b.json"},
		{[]string{"--config-path=/c.json"}, "/c.json"},
	} {
		if got, err := configPath(tt.args); err != nil || got != tt.want {
			t.Errorf("configPath(%q) = %q, %v; want %q", tt.args, got, err, tt.want)
		}
	}
	if _, err := configPath([]string{"--drain-time-s", "45", "-c"}); err == nil {
		t.Error("no bootstrap path accepted")
	}
}

func get(t *testing.T, h http.Handler, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// The admin answers are what pilot-agent's readiness check (pilot/cmd/pilot-agent/status/
// util/stats.go) asks for, with its regular expressions.
func TestAdminStatsFollowTheConfiguration(t *testing.T) {
	st := &stats{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mux := adminMux(st, cancel)
	ready := "/stats?usedonly&filter=" + url.QueryEscape(`^(server\.state|listener_manager\.workers_started)`)
	update := "/stats?usedonly&filter=" + url.QueryEscape(`^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$`)

	if code, _ := get(t, mux, "/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/ready before start: %d", code)
	}
	st.live.Store(true)
	if code, body := get(t, mux, "/ready"); code != http.StatusOK || body != "LIVE\n" {
		t.Errorf("/ready: %d %q", code, body)
	}
	if _, body := get(t, mux, ready); body != "listener_manager.workers_started: 1\nserver.state: 0\n" {
		t.Errorf("readiness stats %q", body)
	}
	want := "cluster_manager.cds.update_rejected: 0\ncluster_manager.cds.update_success: 0\nlistener_manager.lds.update_rejected: 0\nlistener_manager.lds.update_success: 0\n"
	if _, body := get(t, mux, update); body != want {
		t.Errorf("update stats before any config %q", body)
	}
	st.cdsSuccess.Add(1)
	st.ldsSuccess.Add(2)
	if _, body := get(t, mux, update); !strings.Contains(body, "cluster_manager.cds.update_success: 1\n") || !strings.Contains(body, "listener_manager.lds.update_success: 2\n") {
		t.Errorf("update stats after config %q", body)
	}
	if _, body := get(t, mux, "/stats/prometheus"); !strings.Contains(body, "\nenvoy_server_state 0\n") {
		t.Errorf("/stats/prometheus %q", body)
	}
	if code, _ := get(t, mux, "/stats?filter=("); code != http.StatusBadRequest {
		t.Errorf("a bad filter: %d", code)
	}
	if code, _ := get(t, mux, "/drain_listeners?inboundonly&graceful"); code != http.StatusOK {
		t.Errorf("/drain_listeners: %d", code)
	}
	if ctx.Err() != nil {
		t.Fatal("stopped before /quitquitquit")
	}
	if code, _ := get(t, mux, "/quitquitquit"); code != http.StatusOK || ctx.Err() == nil {
		t.Errorf("/quitquitquit: %d, stopping %v", code, ctx.Err())
	}
}
