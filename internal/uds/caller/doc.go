// Package caller names the process at the other end of the agent's local
// socket, as the kernel reports it, and carries that name through an RPC's
// context.
//
// It owns: Cred (SO_PEERCRED of a connection), Info (what the agent decided
// the caller is: its credentials and, in node mode, its pod and identity),
// the Resolver interface that turns one into the other, and the context
// helpers. It does not own reading SO_PEERCRED (the socket server does) nor
// any particular resolution (node mode's pod resolver lives elsewhere).
//
// Nothing a caller says about itself is used: Info is made by the agent from
// the kernel's answer only.
package caller
