package trust

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshagent/meshagent/internal/pki"
)

func TestMergerUnion(t *testing.T) {
	a, b, c := newRoot(t, "a"), newRoot(t, "b"), newRoot(t, "c")
	type step struct {
		source  string
		pem     []byte
		refused bool
		want    []string // the published bundle after the step
		sets    int      // publications so far
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"one source", []step{{source: "file", pem: a, want: []string{"a"}, sets: 1}}},
		{"rotation across two sources keeps the old root while one source holds it", []step{
			{source: "file", pem: a, want: []string{"a"}, sets: 1},
			{source: "configmap", pem: a, want: []string{"a"}, sets: 1},
			{source: "configmap", pem: cat(a, b), want: []string{"a", "b"}, sets: 2},
			{source: "configmap", pem: b, want: []string{"a", "b"}, sets: 2},
			{source: "file", pem: b, want: []string{"b"}, sets: 3},
		}},
		{"de-duplicated in first-seen order", []step{
			{source: "file", pem: cat(b, a, b), want: []string{"b", "a"}, sets: 1},
			{source: "ctb", pem: cat(c, a), want: []string{"b", "a", "c"}, sets: 2},
		}},
		{"a bad update is refused alone and the last good roots stay", []step{
			{source: "file", pem: a, want: []string{"a"}, sets: 1},
			{source: "configmap", pem: b, want: []string{"a", "b"}, sets: 2},
			{source: "configmap", pem: []byte("-----BEGIN CERTIFICATE-----\nbm90\n-----END CERTIFICATE-----\n"), refused: true, want: []string{"a", "b"}, sets: 2},
			{source: "configmap", pem: nil, refused: true, want: []string{"a", "b"}, sets: 2},
			{source: "configmap", pem: append(cat(c), []byte("trailing garbage")...), refused: true, want: []string{"a", "b"}, sets: 2},
			{source: "file", pem: c, want: []string{"c", "b"}, sets: 3},
		}},
		{"a source refused before its first good bundle adds nothing", []step{
			{source: "configmap", pem: []byte("junk"), refused: true, sets: 0},
			{source: "file", pem: a, want: []string{"a"}, sets: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := newPublisher()
			m, err := NewMerger(MergerConfig{Publisher: pub})
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				err := m.Update(s.source, s.pem)
				if (err != nil) != s.refused {
					t.Fatalf("step %d: Update error %v, want refused %v", i, err, s.refused)
				}
				if got := subjects(t, pub.last()); !slices.Equal(got, s.want) {
					t.Fatalf("step %d: published %v, want %v", i, got, s.want)
				}
				if pub.count() != s.sets {
					t.Fatalf("step %d: %d publications, want %d", i, pub.count(), s.sets)
				}
			}
		})
	}
}

func TestMergerNamesItsSources(t *testing.T) {
	pub := newPublisher()
	m, err := NewMerger(MergerConfig{Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	a := newRoot(t, "a")
	_ = m.Update("file:/r.pem", a)
	_ = m.Update("configmap:ns/cm/root-cert.pem", a)
	if err := m.Update("clustertrustbundle:x/y", newRoot(t, "b")); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	got := pub.sources[len(pub.sources)-1]
	pub.mu.Unlock()
	if got != "file:/r.pem+configmap:ns/cm/root-cert.pem+clustertrustbundle:x/y" {
		t.Errorf("source %q", got)
	}
}

func TestMergerCountsRefusals(t *testing.T) {
	reg := prometheus.NewRegistry()
	met := NewMetrics(reg)
	pub := newPublisher()
	m, err := NewMerger(MergerConfig{Publisher: pub, Metrics: met})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Update("cm", []byte("junk")); err == nil {
		t.Fatal("junk accepted")
	}
	if err := m.Update("cm", []byte("  \n")); !errors.Is(err, pki.ErrNoCertificates) {
		t.Fatalf("empty bundle: %v", err)
	}
	m.Refuse("cm", ErrMissing)
	if err := m.Update("file", newRoot(t, "a")); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP meshagent_trust_source_refusals_total Trust bundles a source gave that were refused (did not parse, held no certificate, missing key); the source's last good roots stayed in the merged bundle.
# TYPE meshagent_trust_source_refusals_total counter
meshagent_trust_source_refusals_total{reason="empty",source="cm"} 1
meshagent_trust_source_refusals_total{reason="malformed",source="cm"} 1
meshagent_trust_source_refusals_total{reason="missing",source="cm"} 1
# HELP meshagent_trust_bundle_roots Certificates in the merged trust bundle.
# TYPE meshagent_trust_bundle_roots gauge
meshagent_trust_bundle_roots 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshagent_trust_source_refusals_total", "meshagent_trust_bundle_roots"); err != nil {
		t.Error(err)
	}
}

func TestNewMergerNeedsAPublisher(t *testing.T) {
	if _, err := NewMerger(MergerConfig{}); err == nil {
		t.Error("no error")
	}
}
