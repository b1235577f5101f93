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
