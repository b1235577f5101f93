// Package filewatch tells its owner when the content of a set of files has
// changed and the changes have settled.
//
// It watches the directories that hold the files (and every directory a
// symlink chain passes through), never the files themselves, so it keeps
// working when a file is replaced rather than edited: editors that write a
// temporary file and rename it, atomic renames over the file, deletion and
// re-creation, the Kubernetes `..data` symlink swap used for mounted Secrets
// and ConfigMaps, and a watched directory deleted and made again (its watch
// is re-established; while it is missing, its nearest existing ancestor is
// watched). After any event in a watched directory it waits for the debounce
// period without further events, then re-reads every watched file and
// signals only if the content (or whether it exists) differs from what it
// saw last. Touching a file, or churn of unrelated files in the same
// directory, costs a re-read but no signal.
//
// One fsnotify watcher (one inotify instance) serves the whole process: the
// Watchers share it, and so do the DirWatches (a bare signal for any event
// in one directory, which the socket listener uses to notice its socket
// was removed or replaced), each directory is watched once however many Watchers
// need it, and the fsnotify watcher is closed when the last directory is
// released. A directory that cannot be watched (the process may read the
// files but not list the directory, the user's inotify limits are reached,
// or no inotify instance can be had at all) never stops a Watcher: its files
// are re-read every PollInterval (DefaultPollInterval, one second) instead,
// the directory is logged and counted
// (meshagent_filewatch_watch_failures_total,
// meshagent_filewatch_polling_watchers), and watching is tried again at every
// poll. Only the Watchers that need that directory poll.
//
// It does not parse or validate what it reads; certfile does that.
//
// Ownership and locking: a Watcher is created by New, which does no I/O and
// starts no goroutines, and is run once by Run, which owns its debounce and
// poll timers and its share of the process's watches, and releases them
// before it returns. The shared watcher's reader goroutine runs while at
// least one directory is watched; its table of directories and subscribers
// is guarded by one mutex that is never held while waiting. The Changes
// channel holds at most one pending signal, so signals merge while the
// consumer is busy. Run sends one signal as soon as its watches are in
// place, so a consumer that loads on every signal needs no separate first
// load.
package filewatch
