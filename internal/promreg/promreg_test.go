package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterSharesTheFirstCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	first, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	second, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil || second != first {
		t.Fatalf("second registration: %v, same collector %v", err, second == first)
	}
	conflict := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_total", Help: "other"})
	if got, err := Register(reg, conflict); err == nil || got != conflict {
		t.Fatalf("a conflicting definition: %v", err)
	}
}

func TestAssignPointsAtTheCollectorInUse(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "y_total", Help: "y"}
	first, second := prometheus.NewCounter(opts), prometheus.NewCounter(opts)
	if err := Assign(reg, &first); err != nil {
		t.Fatal(err)
	}
	kept := first
	if err := Assign(reg, &second); err != nil || second != kept {
		t.Fatalf("second field: %v, points at the first collector %v", err, second == kept)
	}
	if err := Assign[prometheus.Counter](nil, &second); err != nil {
		t.Fatalf("nil registerer: %v", err)
	}
}
