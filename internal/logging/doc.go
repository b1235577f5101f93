// Package logging builds the agent's zap logger: human-readable console output
// when stderr is a terminal, JSON lines otherwise, at the level chosen by
// --log-level / MESHAGENT_LOG_LEVEL.
//
// It owns logger construction, and RouteKlog, which sends klog's output
// (client-go's) through the agent's logger so there is one log format. Components receive the *zap.Logger in
// their Config and narrow it with Named; they never build their own.
package logging
