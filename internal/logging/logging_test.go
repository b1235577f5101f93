package logging

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestParseLevel(t *testing.T) {
	for _, l := range Levels {
		if lv, err := ParseLevel(l); err != nil || lv.String() != l {
			t.Errorf("%s: %v %v", l, lv, err)
		}
	}
	if _, err := ParseLevel("verbose"); err == nil || !strings.Contains(err.Error(), "debug, info, warn, error") {
		t.Errorf("bad level: %v", err)
	}
}

func logTo(t *testing.T, cfg Config, log func(*zap.Logger)) string {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg.Output = f
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	log(l)
	_ = l.Sync()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestJSONWhenNotATerminal(t *testing.T) {
	out := logTo(t, Config{Level: "warn"}, func(l *zap.Logger) {
		l.Info("hidden")
		l.Named("sds").Warn("stream closed", zap.String("resource_name", "default"))
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line at warn, got %q", out)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatalf("not JSON: %q", lines[0])
	}
	if m["msg"] != "stream closed" || m["logger"] != "sds" || m["level"] != "warn" || m["resource_name"] != "default" || m["time"] == nil {
		t.Errorf("fields %v", m)
	}
}

func TestConsoleForced(t *testing.T) {
	yes := true
	out := logTo(t, Config{Level: "debug", Console: &yes}, func(l *zap.Logger) { l.Debug("hello", zap.Int("n", 1)) })
	if strings.HasPrefix(out, "{") || !strings.Contains(out, "hello") || !strings.Contains(out, `{"n": 1}`) {
		t.Errorf("console output %q", out)
	}
}

func TestBadLevel(t *testing.T) {
	if _, err := New(Config{Level: "loud"}); err == nil {
		t.Error("no error")
	}
}

func TestAnyWriter(t *testing.T) {
	var b strings.Builder
	l, err := New(Config{Output: &b})
	if err != nil {
		t.Fatal(err)
	}
	l.Info("certificate rotated")
	if !strings.HasPrefix(b.String(), "{") || !strings.Contains(b.String(), `"msg":"certificate rotated"`) {
		t.Errorf("%q", b.String())
	}
	if IsTerminal(&b) {
		t.Error("a builder is not a terminal")
	}
}

// TestConsoleTimesCarryTheDate: a time field (a certificate's not_after)
// in human-readable output says which day it is.
func TestConsoleTimesCarryTheDate(t *testing.T) {
	var buf bytes.Buffer
	console := true
	l, err := New(Config{Output: &buf, Console: &console})
	if err != nil {
		t.Fatal(err)
	}
	notAfter := time.Date(2031, 5, 6, 13, 50, 4, 0, time.UTC)
	l.Info("certificate issued", zap.Time("not_after", notAfter))
	if want := `"not_after": "2031-05-06T13:50:04.000Z"`; !strings.Contains(buf.String(), want) {
		t.Errorf("line %q lacks %s", buf.String(), want)
	}
}
