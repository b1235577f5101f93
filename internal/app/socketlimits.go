package app

import "github.com/meshagent/meshagent/internal/uds/udsserver"

// withSocketLimits sets the local socket's per-caller limits of the
// settings on cfg (MESHAGENT_SOCKET_*).
func (a *App) withSocketLimits(cfg udsserver.Config) udsserver.Config {
	c := a.s
	cfg.MaxConnsPerCaller = c.SocketMaxConnsPerCaller
	cfg.MaxConnRatePerCaller = c.SocketMaxConnRatePerCaller
	cfg.MaxStreamsPerConn = uint32(c.SocketMaxStreamsPerConn)
	cfg.MaxUnaryPerCaller = c.SocketMaxUnaryPerCaller
	cfg.MaxQueuedBytesPerCaller = c.SocketMaxQueuedBytesPerCaller
	cfg.IdleTimeout = c.SocketIdleTimeout
	cfg.LimitNames = udsserver.LimitNames{
		ConnsPerCaller:    "MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER",
		ConnRatePerCaller: "MESHAGENT_SOCKET_MAX_CONNECTION_RATE_PER_CALLER",
		UnaryPerCaller:    "MESHAGENT_SOCKET_MAX_UNARY_PER_CALLER",
		QueuedPerCaller:   "MESHAGENT_SOCKET_MAX_QUEUED_BYTES_PER_CALLER",
	}
	return cfg
}
