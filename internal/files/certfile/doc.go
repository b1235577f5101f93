// Package certfile loads certificates from files: a workload certificate
// chain with its private key, and root bundles (including the system roots,
// for `file-root:system`). Loading validates: both files parse, the key
// matches the leaf and the leaf has not expired. A half-written, truncated or
// mismatched pair is an error, never a value. Only regular files of at most
// 4 MiB are read (internal/regularfile): a device, FIFO or directory is an
// error at once, never a hang or an endless read.
//
// Source adds watching: it holds the last good value, re-loads when
// filewatch reports a change (or, for a directory that cannot be watched,
// at every poll), and publishes a new value only when the load succeeds and
// differs from the one it holds. A failed load is logged with its reason
// and counted; the last good value stays, even once it has expired (callers
// that care check the leaf's NotAfter). Follow hands each new value to a
// function. NewRootSource is the one way a root bundle is named and read:
// a PEM file, or "system" (any case) for the system trust bundle.
//
// RootFeed and PairFeed are the running parts that bring files into the
// secret manager: a RootFeed follows a root bundle file (CA_ROOT_CA,
// XDS_ROOT_CA, a credentials directory's root-cert.pem) into a
// secret.Roots; a PairFeed follows a certificate and key file pair
// (workload credentials, file-mounted certificates) into Manager.Publish.
// Each reads through a Source and has Run(ctx) error.
//
// It does not decide which files to load (cmd/agent and secretmanager do),
// and it does not check a chain against trust roots or a requested identity:
// mounted certificates are served as the operator gave them.
//
// Ownership and locking: a Pair and a pki.Bundle are immutable once
// returned, and a bundle is handed on parsed (RootFeed sets it into
// secret.Roots as is). A Source is safe for concurrent use: Current,
// Wait and Reload may be called from any goroutine; Run may be called once
// and owns the watcher. A
// RootFeed or PairFeed owns its Source; its Run may be called once.
package certfile
