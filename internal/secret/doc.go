// Package secret is what the agent serves, as held in memory: the Secret
// (one SDS resource, immutable once published), the resource names, the
// trust bundle that changes at run time (Roots) and the interfaces of what
// provides them (RootSource, Provider).
//
// It is a leaf: the secret manager, the file packages (certfile,
// fileprovider, outputcerts) and the servers share these types through it,
// so that none of them imports another for a type. Roots is safe for
// concurrent use; a Secret is never modified after it is published.
package secret
