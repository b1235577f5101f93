// Package settings is meshagent's single registry of configuration settings
// and the resolver that turns defaults, environment variables and flags into
// one typed Config.
//
// Every setting is declared once in Registry (name, flag, default, doc,
// accepted values). The CLI flags of cmd/agent, `meshagent config` (via
// Config.Table) and docs/configuration.md (via Markdown) are all derived from
// that declaration, so they cannot drift apart; a golden test fails when the
// committed doc is stale.
//
// It owns parsing and validation of configuration text, including the
// PROXY_CONFIG JSON and the CA_HEADER_/XDS_HEADER_ prefix variables, and the
// rules between settings that the settings alone decide (validate.go: node
// mode's and the Broker API's, the roots of PILOT_CERT_PROVIDER=none). It
// does not own deciding which certificate source runs, nor the rules that
// need that decision or the file system (internal/app does), and it reads
// no files except to check whether the file-mounted xDS root exists; it
// lists the host's addresses for the derived INSTANCE_IP.
//
// A setting the agent accepts but does not act on (for all or some of its
// values) says so through Setting.Unused; Config.Warnings collects these and
// the agent logs them at start-up.
//
// Resolve does not read the process environment itself: the caller passes it
// in, so tests and `meshagent config` see exactly what `meshagent run` would.
// A Config is immutable after Resolve and safe to share.
package settings
