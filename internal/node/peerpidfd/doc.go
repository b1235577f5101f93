// Package peerpidfd gets a pidfd of the process at the other end of a Unix
// socket, and carries it through a context to whoever resolves the caller.
//
// A pid names a process only until the process exits and the kernel hands
// the pid to a new one; a pidfd keeps naming the process it was taken for.
// Taken when a connection is accepted, it lets a later lookup check that the
// process behind the connection's pid is still the one that connected.
//
// It owns reading the pidfd (FromConn: SO_PEERPIDFD, Linux 6.5, taken by the
// kernel at connect(); on older kernels pidfd_open of the SO_PEERCRED pid,
// which is exact unless the pid was reused between connect() and the call, so
// call it at accept) and the context helpers. The socket server owns the fd:
// it takes it at accept, passes it with NewContext to the resolver, and
// closes it with the connection. It keeps no state and starts nothing.
package peerpidfd
