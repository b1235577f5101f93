// Package secretmanager is the identity-keyed certificate cache: it holds the
// workload certificates of any number of identities and the trust bundle
// ("ROOTCA"), keeps them fresh, and signals their changes.
//
// docs/architecture.md ("The identity-keyed certificate cache", and its
// "Locking and ownership") is the description of its entries, scheduler,
// retries, renewal floor, answer checks, roots, dropping and locks; this
// comment only says where its edges are.
//
// It owns: the entries (one per pki.Identity in use; the own identity,
// Config.Identity, is never dropped), the one scheduler (Run), the checks
// of every CA answer, the roots as a resource of their own, readiness and
// liveness of the own identity, and /debug/certs data (CertInfo).
//
// It does not own: the CA protocols (caclient), who a caller is (sds,
// workloadapi and podcert resolve it and pass its identity to Secret,
// Current and Watch; the zero Identity means the own one), SDS framing,
// file watching and parsing (certfile feeds Roots.Set, Publish and
// Config.Initial), writing files (outputcerts.Sync is a subscriber like any
// other), or the status page (internal/app converts CertInfo). Other
// resource names (file-cert:, file-root:) are served by Providers keyed by
// prefix.
//
// Lock order: pubMu, then mu, then the Rand lock; mu is never held across
// key generation, a CSR, I/O or a callback. New starts no goroutines.
package secretmanager
