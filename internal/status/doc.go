// Package status is the agent's status HTTP server (docs/operations.md): readiness and
// liveness probes, Prometheus metrics, the list of held certificates, and the
// loopback-only debugging and shutdown endpoints.
//
// It owns the HTTP listener and nothing else: what "ready" and "live" mean is
// supplied by other components as named Checks, and the certificates come
// from CertListers, so status depends on no other meshagent package.
//
//	GET  /healthz/ready   200 when every readiness check passes, else 503 with the reasons
//	GET  /healthz/live    200 unless a liveness check fails (e.g. the held certificate expired)
//	GET  /metrics         Prometheus text format from Config.Gatherer
//	GET  /debug/certs     JSON array of CertInfo (in node mode, with how many pods use each identity), loopback callers only
//	GET  /debug/pprof/*   net/http/pprof, loopback callers only
//	POST /quitquitquit    loopback callers only; Run then returns nil
//
// Checks and listers may be added at any time, also while serving; a mutex
// guards the lists. Checks and listers are called on every request, from the
// request's goroutine, so they must be fast and must not block.
package status
