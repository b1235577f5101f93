package settings

import (
	"strings"
	"testing"
)

func TestParseBrokers(t *testing.T) {
	tests := []struct {
		name, raw string
		want      string // shown again; "" for none
		err       string // part of the error; "" for none
	}{
		{name: "empty", raw: ""},
		{name: "blank entries", raw: " ; ;"},
		{name: "one", raw: "spiffe://cluster.local/ns/istio-system/sa/ztunnel=pod", want: "spiffe://cluster.local/ns/istio-system/sa/ztunnel=pod"},
		{name: "types in canonical order, spaces", raw: " spiffe://td/a = pod , pid ; spiffe://td/b=pid ",
			want: "spiffe://td/a=pid,pod;spiffe://td/b=pid"},
		{name: "no types", raw: "spiffe://td/a=", err: `unknown reference type ""`},
		{name: "no equals", raw: "spiffe://td/a", err: "has no '='"},
		{name: "unknown type", raw: "spiffe://td/a=pid,node", err: `unknown reference type "node"`},
		{name: "type twice", raw: "spiffe://td/a=pid,pid", err: "listed twice"},
		{name: "id twice", raw: "spiffe://td/a=pid;spiffe://td/a=pod", err: "spiffe://td/a listed twice"},
		{name: "not a spiffe id", raw: "https://td/a=pid", err: "is not a SPIFFE ID"},
		{name: "trust domain only", raw: "spiffe://td=pid", want: "spiffe://td=pid"},
		{name: "upper case", raw: "spiffe://TD/a=pid", err: "is not a SPIFFE ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBrokers(tt.raw)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseBrokers(%q) error %v, want one containing %q", tt.raw, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseBrokers(%q): %v", tt.raw, err)
			}
			parts := make([]string, len(got))
			for i, b := range got {
				parts[i] = b.String()
			}
			if shown := strings.Join(parts, ";"); shown != tt.want {
				t.Fatalf("ParseBrokers(%q) = %q, want %q", tt.raw, shown, tt.want)
			}
		})
	}
}

func TestParseBrokersBound(t *testing.T) {
	var b strings.Builder
	for i := range maxBrokers + 1 {
		b.WriteString("spiffe://td/b" + itoa(i) + "=pid;")
	}
	if _, err := ParseBrokers(b.String()); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("%d brokers: error %v, want a bound", maxBrokers+1, err)
	}
}

// FuzzParseBrokers: never a panic; an error is one line; an accepted list
// shown and parsed again is the same list, and allows only known types.
func FuzzParseBrokers(f *testing.F) {
	for _, seed := range []string{"", "spiffe://td/a=pid,pod", "spiffe://td/a=pod;spiffe://td/b=pid", "=", ";;", "spiffe://td/a==pid",
		"spiffe://td/a=pid;spiffe://td/a=pid", "spiffe://td/%41=pid", "spiffe://td/a\n=pid", "spiffe://td/a=pid,,pod"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := ParseBrokers(raw)
		if err != nil {
			if e := (&InvalidError{Name: "MESHAGENT_BROKERS", Value: raw, Why: err.Error()}).Error(); strings.ContainsAny(e, "\n\r") {
				t.Fatalf("error not one line: %q", e)
			}
			return
		}
		parts := make([]string, len(got))
		for i, b := range got {
			if !b.PID && !b.Pod {
				t.Fatalf("%q: broker %s allowed no reference type", raw, b.ID)
			}
			parts[i] = b.String()
		}
		shown := strings.Join(parts, ";")
		again, err := ParseBrokers(shown)
		if err != nil || len(again) != len(got) {
			t.Fatalf("%q shown as %q, parsed again: %v (%d brokers, want %d)", raw, shown, err, len(again), len(got))
		}
		for i := range got {
			if again[i] != got[i] {
				t.Fatalf("%q shown as %q: broker %d is %v, then %v", raw, shown, i, got[i], again[i])
			}
		}
	})
}
