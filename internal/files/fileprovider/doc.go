// Package fileprovider serves the SDS resources that name files directly
// (docs/architecture.md): "file-cert:<cert-path>~<key-path>" (a certificate chain and its
// key) and "file-root:<path>" or "file-root:system" (a trust bundle). It is a
// secret.Provider, registered in the manager's Config.Providers under
// secret.FileCertPrefix and secret.FileRootPrefix.
//
// A name is held while at least one Watch of it is open: the first Watch
// loads its files and creates a watched certfile.Source for them; later
// changes are re-loaded after the debounce and signalled to the name's
// watchers; the last release stops the source (its directory watches are
// dropped) and forgets the name. MaxResources bounds the names held at
// once, not the names ever asked for. Secret for a name nobody holds loads
// the files for that call only. A name whose files cannot be loaded is not
// held: the request fails with an error wrapping
// secret.ErrUnknownResource and the next request tries again. Once a
// name is held, a bad change (a truncated key, a mismatched pair) is
// rejected by the source and the last good value stays. Files whose
// directory cannot be watched are re-read periodically (filewatch), so no
// file a client names can stop the provider: Run fails for nothing a client
// does.
//
// It does not own the files, does not write them and does not renew anything.
// Paths are used as given (relative ones against the working directory);
// with Config.AllowedDirs, a held name's files are opened beneath their
// allowed directory at every load.
//
// Ownership and locking: Run starts the watchers of every held name under
// its context and stops them all when it returns; names first held while
// Run is active are started at once, names held before Run are started when
// it begins, and after Run has returned new names are refused. One mutex
// guards the table of names and their reference counts; it is never held
// during file I/O. Each name has its own mutex for its converted secret and
// its watchers. Secrets handed out are never modified.
package fileprovider
