// Package promreg registers Prometheus collectors so that components made
// more than once against one registry (a client rebuilt, many file sources)
// share the collectors registered first.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg, or returns the collector of the same type
// already registered under the same description. Any other failure (a
// conflicting definition under the same name) returns c, unregistered, and
// the error.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// Assign registers *c with Register and points *c at the collector in use:
// c's own, or the one of the same description registered first. A nil reg
// registers nothing. It lets a component register the fields of its
// metrics struct one by one:
//
//	err := errors.Join(promreg.Assign(reg, &m.requests), promreg.Assign(reg, &m.errors))
func Assign[C prometheus.Collector](reg prometheus.Registerer, c *C) error {
	if reg == nil {
		return nil
	}
	got, err := Register(reg, *c)
	*c = got
	return err
}
