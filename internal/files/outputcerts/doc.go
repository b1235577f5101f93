// Package outputcerts writes the workload certificate, its key and the trust
// roots into the OUTPUT_CERTS directory (docs/configuration.md), for VMs and proxyless
// gRPC, and reads them back when the agent restarts.
//
// Every file is replaced atomically (temporary file in the same directory,
// fsync, rename), only when its content changed, and all changed files are
// written and synced before the first rename; the renames follow back to
// back, key first. Skipping unchanged files means watchers of the directory
// (gRPC's file_watcher, reload hooks) are not woken for nothing. key.pem is
// 0600; a directory the writer creates is 0700 (or 0750). Two files cannot be replaced in one step: a reader that
// opens key.pem and cert-chain.pem separately can, for the moment between the
// two renames, see a new key with the old chain. Readers must check that the
// pair matches and read again if not (Load does; gRPC's file_watcher keeps
// its old material and retries).
//
// Options of the Writer: file modes and an owning group (set on the
// temporary file, before the rename), and a single-file bundle of the key
// followed by the chain (as Kubernetes' podCertificate volumes write it),
// replaced with the pair. With a trust domain, Sync also writes the roots as
// a SPIFFE trust bundle map (files.BundleMapFile, gRFC A87).
//
// Hook tells an application that files changed, as spiffe-helper's reload
// hooks do: a command (no shell, in a process group of its own, killed after
// its timeout), a signal to a pid file's process or to processes found by
// name in /proc. Sync fires it once per write that replaced files, after
// the last rename and the directory sync, on its own goroutine.
//
// Sync decides when to write: it subscribes to the agent's secret source
// (the workload certificate "default" and the trust bundle "ROOTCA") and
// hands what is held to the Writer at start and after every change signal.
// The package does not watch the directory.
//
// Ownership and locking: a Writer owns the three files in its directory and
// is safe for concurrent use (writes are serialised). It starts no
// goroutines. A Sync's Run is its only goroutine; it holds its two
// subscriptions until it returns.
package outputcerts
