// Package trust keeps the agent's trust bundle live from several sources
// at once: the root files of today (followed through their feed), one key
// of a ConfigMap (istiod's istio-ca-root-cert/root-cert.pem in every
// namespace, Linkerd's linkerd-identity-trust-roots/ca-bundle.crt), and the
// ClusterTrustBundles of a signer (certificates.k8s.io/v1). Each source is
// a running part with Run(ctx) error that reports to a Sink; the Merger is
// the Sink: it keeps the last good roots of every source and publishes
// their union, each certificate once, to a Publisher (the
// secretmanager.Roots the agent serves as ROOTCA, hands to the Workload API
// and OUTPUT_CERTS, and verifies the CA's and the control plane's TLS
// certificates and the CA's answers with).
//
// A union is what makes a root rotation safe: while one source already
// holds the new root and another still only the old one, both are trusted,
// and a root leaves the bundle only once no source holds it any more
// (docs/trust.md has the runbook).
//
// A source that gives something unusable (a bundle that does not parse or
// holds no certificate, a ConfigMap that was deleted or lacks its key, a
// signer with no bundle left) is refused alone: logged with its reason,
// counted in meshagent_trust_source_refusals_total, and its last good
// roots stay in the merge; the other sources keep serving.
//
// CRLFeed follows the CRL file (pilot-agent's
// ./var/run/secrets/istio/crl/ca-crl.pem) into the same roots, which serve
// it in ROOTCA's validation context; a file that does not parse is refused
// and the last good CRL stays; no file means no CRL. ParseCRL is strict
// (fuzzed).
//
// It does not decide which sources run (internal/app does, from the
// settings), and it reads no file itself. Kubernetes objects are read
// through internal/kubeclient (its Client for ConfigMaps, its Certificates
// for ClusterTrustBundles), which decodes the few fields the agent needs
// into small types of its own rather than link client-go's clientset.
// The ConfigMap and ClusterTrustBundle sources run a client-go informer
// each, which lists, watches and retries with backoff.
//
// Locking: the Merger's state sits behind one mutex, held while it
// publishes, so publications happen in the order of the updates that
// caused them. Sources hold no lock while calling the sink, except the
// ClusterTrustBundle source, which serialises its own recomputations.
package trust
