package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// TestRouteKlogCarriesClientGoWarnings: a warning the API server sends
// (HTTP Warning header, code 299), handled by client-go's default warning
// handler, is written by the agent's zap logger as a JSON line; klog's
// chatty levels are not.
func TestRouteKlogCarriesClientGoWarnings(t *testing.T) {
	var buf bytes.Buffer
	core := zapcore.NewCore(Encoder(false), zapcore.AddSync(&buf), zapcore.InfoLevel)
	restore := RouteKlog(zap.New(core))
	defer restore()

	rest.WarningLogger{}.HandleWarningHeaderWithContext(context.Background(), 299, "", "v1 Thing is deprecated")
	klog.V(4).Info("chatty detail")
	klog.Flush()

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1:\n%s", len(lines), buf.String())
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &entry); err != nil {
		t.Fatalf("not a JSON line: %q: %v", lines[0], err)
	}
	msg, _ := entry["msg"].(string)
	if !strings.Contains(msg, "v1 Thing is deprecated") || entry["logger"] != "client-go" || entry["level"] != "info" {
		t.Fatalf("entry %v, want the warning at info from logger client-go", entry)
	}
}
