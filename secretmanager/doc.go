// Package secretmanager is the identity-keyed certificate cache: it holds the
// workload certificates of any number of identities and the trust bundle, and
// keeps them fresh.
//
// It owns: one entry per workload identity in use (pki.Identity: a SPIFFE ID,
// or Linkerd's DNS identity), created on the first Secret, Watch or Prefetch
// and dropped once nothing holds it for Config.IdleGrace (the own identity,
// Config.Identity, is never dropped); what "default" means for the identity
// a caller was resolved to (that identity when set, else the own identity;
// the resolving is the edge's: sds and workloadapi pass it in); the rotation
// schedule of docs/operations.md (RenewAt, a pure function of the arrival time, the
// expiry and a random draw, raised to RenewalFloor so no setting makes it
// loop); the scheduler that bounds the CSRs in flight across identities
// (Config.MaxConcurrentCSRs) and orders them (a caller waiting, then a first
// certificate, then renewals; earliest due first); per-identity retries with
// internal/backoff; the checks of every CA answer (pki.VerifyIssued against
// the current roots; a rejection is logged with its reason, counted in
// meshagent_ca_answers_rejected_total and retried while the previous
// certificate stays in service until it expires); the trust bundle
// ("ROOTCA") as a resource of its own whose changes are pushed at once and
// only re-verify the leaves; the change signals to subscribers; readiness
// and liveness of the own identity; and /debug/certs data for every
// identity.
//
// It does not own: the CA protocols (caclient, which make one request per
// Sign), SDS framing (sds), who a caller is (the caller package and its
// resolvers), file watching and parsing of certificate files (other
// packages, certfile's feeds, feed Roots.Set, Publish and Config.Initial),
// or writing files (outputcerts.Sync, a subscriber like any other). Other
// resource names (file-cert:, file-root:) are served by Providers keyed by
// prefix, so the name-to-secret mapping stays in one place.
//
// Entries are values guarded by Manager.mu: the current certificate
// (immutable), version, last error, in-flight flag, due time, failure count,
// subscribers, waiting callers, prefetch holds and a ticket per queue. Run
// is the one scheduler: it keeps three queues under mu (entries by due
// time, due entries ranked for a CSR slot, unused entries by drop time) with
// lazy deletion (an item whose ticket is no longer its entry's, because the
// entry was queued again, used again or dropped, is discarded when it
// reaches the top), starts one goroutine per CSR while fewer than
// MaxConcurrentCSRs are out, and waits for them before it returns. A signing goroutine generates
// the key, sends the CSR and checks the answer holding no lock, then hands
// the result back under mu; a result for an entry dropped meanwhile is
// discarded. A new key is generated for every request and kept in memory
// only.
//
// Subscribers: Watch returns a channel with a one-slot buffer; a publication
// does a non-blocking send to each subscriber of the identity (or of
// ROOTCA), so signals merge, a slow subscriber never delays the others, and
// no goroutine is started per subscriber. Secret never waits on the network:
// it reads the entry and, without a valid certificate, waits on its own
// channel for a publication, bounded by its context. Current reads what is
// held now and never waits (SDS streams read every name with it, so no name
// waits for another).
//
// Locking: Manager.mu guards the entries, the queues, the in-flight count,
// the version counter and the roots; it is never held across key
// generation, a CSR, I/O (logging included: what is logged is gathered under
// mu and written after), the re-verification of many leaves or a callback.
// pubMu serialises publications so they are seen in version order; every
// publication (a CA answer, Publish, a root change) goes through one
// sequence, publish: the change under mu, then OnPublish, then the signals.
// Lock order is pubMu, then mu, then the Rand lock. Secrets are immutable
// once published, and so is the pki.Bundle of the trust roots, handed on
// parsed. Roots has its own mutex. New starts no goroutines.
package secretmanager
