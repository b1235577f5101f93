package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/uds/sockprobe"
)

// Source is where workload certificates come from (docs/modes.md). It is not the
// agent's mode (settings.ModeSidecar or settings.ModeNode: whom it serves).
type Source string

// The certificate sources, in the order they are considered.
const (
	// SourceExternal: another agent already serves SDS on the socket;
	// meshagent serves no SDS.
	SourceExternal Source = "external"
	// SourceDev: an in-process CA with a fresh in-memory root (--dev).
	SourceDev Source = "dev"
	// SourceWorkloadCredentials: serve the pre-provisioned credential files.
	SourceWorkloadCredentials Source = "workload-credentials"
	// SourceFileMounted: serve ./etc/certs (FILE_MOUNTED_CERTS=true).
	SourceFileMounted Source = "file-mounted"
	// SourceCA: ask the CA named by CA_PROVIDER at CA_ADDR.
	SourceCA Source = "ca"
)

// credentialFiles are the three files a credentials directory must hold.
var credentialFiles = []string{files.CertChainFile, files.KeyFile, files.RootCertFile}

// sdsProbeTimeout is how long an existing SDS socket has to answer.
const sdsProbeTimeout = time.Second

// SourceDecision is the certificate source chosen at start-up and why. Its
// JSON names the source "source", and "mode" too, the name it had before
// (deprecated: "mode" is MESHAGENT_MODE's word, sidecar or node; the alias
// goes in the next release).
type SourceDecision struct {
	Source Source `json:"source"`
	Reason string `json:"reason"`
	// Provider is CA_PROVIDER with SourceCA.
	Provider string `json:"provider,omitempty"`
	// StaleSocket is set when a socket at the SDS path answered nothing: Run
	// removes it before serving; `meshagent config` only reports it.
	StaleSocket bool `json:"stale_socket,omitempty"`
}

// sourceDecisionJSON is SourceDecision's JSON, with the deprecated alias.
type sourceDecisionJSON struct {
	Source Source `json:"source"`
	// Mode is Source under its former name (deprecated).
	Mode        Source `json:"mode,omitempty"`
	Reason      string `json:"reason"`
	Provider    string `json:"provider,omitempty"`
	StaleSocket bool   `json:"stale_socket,omitempty"`
}

// MarshalJSON writes the source under "source" and, deprecated, "mode".
func (d SourceDecision) MarshalJSON() ([]byte, error) {
	return json.Marshal(sourceDecisionJSON{Source: d.Source, Mode: d.Source, Reason: d.Reason, Provider: d.Provider, StaleSocket: d.StaleSocket})
}

// UnmarshalJSON reads what MarshalJSON writes, and JSON that names the
// source "mode" only.
func (d *SourceDecision) UnmarshalJSON(b []byte) error {
	var j sourceDecisionJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	if j.Source == "" {
		j.Source = j.Mode
	}
	*d = SourceDecision{Source: j.Source, Reason: j.Reason, Provider: j.Provider, StaleSocket: j.StaleSocket}
	return nil
}

// missingFiles returns the credential files not present in dir.
func missingFiles(dir string) []string {
	var missing []string
	for _, f := range credentialFiles {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || !st.Mode().IsRegular() {
			missing = append(missing, f)
		}
	}
	return missing
}

// SelectSource decides where certificates come from (docs/modes.md), in this order:
// a healthy socket at the SDS path (another agent serves SDS; not in node
// mode, where the path is the node agent's own and what answers there is
// replaced when the agent listens), --dev, the
// workload credentials directory holding all three files,
// FILE_MOUNTED_CERTS=true, and otherwise the CA. It only looks: a stale
// socket is reported in the decision, not removed.
//
// --dev is considered after a healthy external socket so that trying the
// agent never takes a socket away from an agent that is serving it.
func SelectSource(ctx context.Context, cfg *settings.Config) SourceDecision {
	var notes []string
	stale := false
	switch state, err := sockprobe.Probe(ctx, cfg.SDSSocket, sdsProbeTimeout, sockprobe.GRPC); state {
	case sockprobe.Alive:
		if cfg.Mode == settings.ModeNode {
			// The node agent's socket is its own: what answers there (a
			// pod's impostor) is replaced when the agent listens.
			notes = append(notes, fmt.Sprintf("something answers on %s; node mode replaces it", cfg.SDSSocket))
			break
		}
		if cfg.SocketHandoff != "" {
			// The socket holder answers while no agent serves.
			notes = append(notes, fmt.Sprintf("something answers on %s; the agent takes it from its holder", cfg.SDSSocket))
			break
		}
		return SourceDecision{Source: SourceExternal, Reason: fmt.Sprintf("an SDS server already answers on %s; meshagent will not serve SDS there", cfg.SDSSocket)}
	case sockprobe.Stale:
		if cfg.SocketHandoff != "" {
			// The holder's to replace, not the agent's to remove.
			notes = append(notes, fmt.Sprintf("stale socket %s is left to its holder (%v)", cfg.SDSSocket, err))
			break
		}
		stale = true
		notes = append(notes, fmt.Sprintf("stale socket %s will be removed (%v)", cfg.SDSSocket, err))
	case sockprobe.NotSocket:
		notes = append(notes, fmt.Sprintf("SDS socket path unusable: %v", err))
	}
	decide := func(d SourceDecision) SourceDecision {
		d.StaleSocket = stale
		if len(notes) > 0 {
			d.Reason += "; " + strings.Join(notes, "; ")
		}
		return d
	}

	if cfg.Dev {
		return decide(SourceDecision{Source: SourceDev, Reason: "--dev: an in-process CA with a fresh in-memory root, not for production"})
	}
	switch missing := missingFiles(cfg.WorkloadCredentialsDir); {
	case len(missing) == 0:
		return decide(SourceDecision{Source: SourceWorkloadCredentials, Reason: fmt.Sprintf("%s holds %s", cfg.WorkloadCredentialsDir, strings.Join(credentialFiles, ", "))})
	case len(missing) < len(credentialFiles):
		notes = append(notes, fmt.Sprintf("%s is incomplete (missing %s)", cfg.WorkloadCredentialsDir, strings.Join(missing, ", ")))
	}
	if cfg.FileMountedCerts {
		return decide(SourceDecision{Source: SourceFileMounted, Reason: fmt.Sprintf("FILE_MOUNTED_CERTS=true: serving %s", cfg.FileMountedCertsDir)})
	}
	return decide(SourceDecision{
		Source:   SourceCA,
		Provider: cfg.CAProvider,
		Reason:   fmt.Sprintf("CA_PROVIDER=%s at CA_ADDR=%s", cfg.CAProvider, cfg.CAAddr),
	})
}

// removeStaleSocket deletes the socket at the SDS path if it still answers
// no gRPC dial.
func removeStaleSocket(ctx context.Context, log *zap.Logger, path string) {
	removed, err := sockprobe.RemoveStale(ctx, path, sdsProbeTimeout, sockprobe.GRPC)
	if err != nil {
		log.Warn("cannot remove stale SDS socket", zap.String(logkeys.Path, path), zap.Error(err))
		return
	}
	if removed {
		log.Info("removed stale SDS socket", zap.String(logkeys.Path, path))
	}
}
