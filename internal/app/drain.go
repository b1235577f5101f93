package app

import (
	"errors"
	"time"
)

// DrainPeriod is how long the agent keeps serving after SIGTERM
// (docs/operations.md, "Termination"): PROXY_CONFIG terminationDrainDuration
// beside an Envoy, as pilot-agent drains only when it runs one; none in node
// mode, whose pods keep the certificates they hold while the DaemonSet's
// next agent, which starts only once this one is gone, takes the socket
// over; none with DISABLE_ENVOY.
func (a *App) DrainPeriod() time.Duration {
	if a.nodeMode() || a.s.DisableEnvoy {
		return 0
	}
	return a.s.TerminationDrainDuration
}

// errDraining is the readiness of a draining agent.
var errDraining = errors.New("the agent is stopping: it serves its clients until the drain ends (SIGTERM)")

// StartDrain marks the agent as stopping: /healthz/ready answers 503 from
// now on, as pilot-agent's readiness fails from SIGTERM on; SDS, the
// Workload API, the xDS proxy and the rest serve as before.
func (a *App) StartDrain() {
	a.status.AddReadiness("draining", func() error { return errDraining })
}
