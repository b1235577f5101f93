// Package podindex keeps the pods scheduled on one node, by UID, and counts
// the pods of each workload identity so that certificates can be fetched
// ahead for a service account that arrives on the node and dropped when its
// last pod is gone.
//
// It owns a client-go informer of the pods with spec.nodeName=<node> (a
// field selector: the API server sends nothing about other nodes), listed
// and watched through kubeclient as kubeclient.Pod (only the pod fields the
// agent reads are decoded; client-go's clientset is not linked), a
// transform that keeps only the fields node mode reads (name, namespace,
// UID, service account, node name, phase, deletion timestamp, the
// meshagent.io/prefetch annotation, and whether it mounts the node agent's
// CSI volume), the UID map
// built from it, and the identity reference counts. It does not read /proc or
// cgroups (package podresolver does) nor hold certificates (the caller's
// IdentityHandler decides what an identity's arrival and departure mean).
//
// Which pods count toward an identity: every pod of the node whose phase is
// not Succeeded or Failed, deleted or not. A pod being deleted still runs its
// containers through their grace period and needs its certificate to drain;
// a pod in a terminal phase has no container left to serve. The identity of a
// pod is the one Config.Scheme gives its namespace and service account (an
// empty service account is "default", as the API server's admission fills
// it).
//
// Events: IdentityAdded is called when an identity's first counted pod is
// seen, IdentityRemoved when its last counted pod is deleted or terminates.
// Both are called from the informer's one event goroutine, in order, never
// concurrently and never while the index's lock is held, so a handler may
// call back into the Index; a handler that blocks delays later events (and
// Wait), not lookups.
//
// Prefetch says whether a counted pod of an identity asks for its
// certificate ahead: it mounts the node agent's CSI volume
// (Config.CSIDriver), which only a pod that will ask for its identity does,
// or is annotated meshagent.io/prefetch: "true" (and not "false"). Node mode
// fetches ahead only for those, so that the pods of the node that never ask
// (kube-system's, unmeshed ones) cost no certificate.
//
// PodsOf lists a service account's counted pods (those not being deleted
// first), to which node mode binds the account's CA tokens when the CA has
// no impersonation (Linkerd).
//
// Locking: one mutex guards the UID map and the counts; Get, Wait,
// Identities and PodsOf take it briefly. New starts nothing; Run runs the informer until
// its context ends.
package podindex
