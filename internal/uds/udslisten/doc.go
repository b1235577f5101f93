// Package udslisten is the agent's Unix-socket listener: the SDS socket and
// the xDS proxy's socket are both made and kept by it.
//
// It owns the socket file and the directories it creates, nothing else:
//   - Directories missing on the way to the socket are created with
//     Config.DirMode; an existing directory is never chmodded (a socket
//     directory set to /tmp keeps its sticky bit).
//   - What sits at the path at start is replaced when Config.Replace is set
//     (node mode: an impostor socket bound before the agent, a regular file);
//     otherwise a stale socket is replaced, a live one is ErrInUse and
//     anything else ErrNotSocket, both left alone.
//   - The socket is bound under a temporary name beside the path and renamed
//     onto it, so the path never lacks a socket while it is replaced.
//   - It remembers the socket it bound (device and inode). Watch looks at the
//     path after each inotify event in its directory (through the process's
//     shared watch, internal/files/filewatch.DirWatch, so an idle agent is
//     never woken); when the socket was removed or replaced it binds again
//     (logged, reported to Config.OnRebind), backing off from
//     Config.CheckInterval while something keeps replacing it. A directory
//     that cannot be watched is looked at every Config.CheckInterval. A
//     directory above the socket's that is renamed away is not seen.
//   - Close removes the socket only if it is still the one it bound.
//
// Accept serves connections from the socket bound last; connections made to
// a socket before it was replaced stay open.
//
// Concurrency: Listen binds and starts nothing; Watch runs until its context
// ends or the listener is closed. Accept, Close and Watch may be called from
// different goroutines.
package udslisten
