package main

import (
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
)

// withSocketLimits sets the local socket's per-caller limits of the
// settings on cfg (MESHAGENT_SOCKET_*).
func (a *agent) withSocketLimits(cfg udsserver.Config) udsserver.Config {
	c := a.cfg
	cfg.MaxConnsPerCaller = c.SocketMaxConnsPerCaller
	cfg.MaxStreamsPerConn = uint32(c.SocketMaxStreamsPerConn)
	cfg.MaxUnaryPerCaller = c.SocketMaxUnaryPerCaller
	cfg.MaxQueuedBytesPerCaller = c.SocketMaxQueuedBytesPerCaller
	cfg.IdleTimeout = c.SocketIdleTimeout
	return cfg
}

// podLeft is the pod index's PodLeft in node mode: the pod's connections
// to the local socket end, saying why.
func (a *agent) podLeft(p podindex.Pod, why string) {
	if s := a.localSocket.Load(); s != nil {
		s.CallerLeft(p.UID, "pod "+p.String()+" "+why)
	}
}
