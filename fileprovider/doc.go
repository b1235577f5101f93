// Package fileprovider serves the SDS resources that name files directly
// (SPEC 9): "file-cert:<cert-path>~<key-path>" (a certificate chain and its
// key) and "file-root:<path>" or "file-root:system" (a trust bundle). It is a
// secretmanager.Provider, registered in the manager's Config.Providers under
// secretmanager.FileCertPrefix and secretmanager.FileRootPrefix.
//
// The first request for a name loads its files and creates a watched
// certfile.Source for them; later changes are re-loaded after the debounce
// and signalled to the name's watchers. A name whose files cannot be loaded
// the first time is not kept: the request fails with an error wrapping
// secretmanager.ErrUnknownResource and the next request tries again. Once a
// name is held, a bad change (a truncated key, a mismatched pair) is rejected
// by the source and the last good value stays.
//
// It does not own the files, does not write them and does not renew anything.
// Paths are used as given (relative ones against the working directory).
//
// Ownership and locking: Run starts the watchers of every held name under
// its context and stops them all when it returns; names first requested
// while Run is active are started at once, names requested before Run are
// started when it begins, and after Run has returned new names are refused.
// One mutex guards the table of names; each name has its own mutex for its
// converted secret and its watchers. Secrets handed out are never modified.
package fileprovider
