// Package filewatch tells its owner when the content of a set of files has
// changed and the changes have settled.
//
// It watches the directories that hold the files (and every directory a
// symlink chain passes through), never the files themselves, so it keeps
// working when a file is replaced rather than edited: editors that write a
// temporary file and rename it, atomic renames over the file, deletion and
// re-creation, and the Kubernetes `..data` symlink swap used for mounted
// Secrets and ConfigMaps. After any event in a watched directory it waits for
// the debounce period without further events, then re-reads every watched
// file and signals only if the content (or whether it exists) differs from
// what it saw last. Touching a file, or churn of unrelated files in the same
// directory, costs a re-read but no signal.
//
// It does not parse or validate what it reads; certfile does that.
//
// Ownership and locking: a Watcher is created by New, which does no I/O and
// starts no goroutines, and is run once by Run, which owns the fsnotify
// watcher and the debounce timer and releases both before it returns. The
// Changes channel is the only state shared with other goroutines; it holds at
// most one pending signal, so signals merge while the consumer is busy. Run
// sends one signal as soon as its watches are in place, so a consumer that
// loads on every signal needs no separate first load.
package filewatch
