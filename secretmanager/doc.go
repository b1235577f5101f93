// Package secretmanager holds the secrets served over SDS and keeps the
// workload certificate fresh.
//
// It owns: the workload certificate and key ("default"), the trust bundle
// ("ROOTCA"), the rotation schedule of SPEC 8 (RenewAt, a pure function of the
// arrival time, the expiry and a random draw), retries with capped exponential
// backoff and jitter (RetryDelay), the checks of every CA answer
// (pki.VerifyIssued against the current roots; a rejection is logged with its
// reason, counted in meshagent_ca_answers_rejected_total and retried while the
// previous certificate stays in service until it expires), the change signals
// to subscribers, readiness and liveness, and /debug/certs data.
//
// It does not own: the CA protocols (caclient), SDS framing (sds), file
// watching and parsing of certificate files (other packages feed Roots.Set,
// Publish and Config.Initial), or writing files (Config.OnPublish). Other
// resource names (file-cert:, file-root:) are served by Providers keyed by
// prefix, so the name-to-secret mapping stays in one place.
//
// Requests: only the Run goroutine talks to the CA, so there is at most one
// CSR in flight however many callers wait in Secret; callers that find no
// valid certificate wait for the next publication (bounded by their context).
// A new key is generated for every request and kept in memory only.
//
// Subscribers: Watch returns a channel with a one-slot buffer; a publication
// does a non-blocking send to each subscriber of the name, so signals merge,
// a slow subscriber never delays the others, publishing is O(subscribers) and
// no goroutine is started per subscriber.
//
// Locking: Manager.mu guards the held secrets, the version counter and the
// last error; it is never held while calling out. pubMu serialises
// publications (state change, OnPublish, signals) so they are seen in version
// order; lock order is pubMu then mu. Secrets are immutable once published.
// Roots has its own mutex. New starts no goroutines; Run starts none either
// and does all its waiting on timers of the injected clock.
package secretmanager
