package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/uds/sockprobe"
)

// Mode is where workload certificates come from (SPEC 5).
type Mode string

// The modes, in the order they are considered.
const (
	// ModeExternal: another agent already serves SDS on the socket; meshagent
	// serves no SDS.
	ModeExternal Mode = "external"
	// ModeDev: an in-process CA with a fresh in-memory root (--dev).
	ModeDev Mode = "dev"
	// ModeWorkloadCredentials: serve the pre-provisioned credential files.
	ModeWorkloadCredentials Mode = "workload-credentials"
	// ModeFileMounted: serve ./etc/certs (FILE_MOUNTED_CERTS=true).
	ModeFileMounted Mode = "file-mounted"
	// ModeCA: ask the CA named by CA_PROVIDER at CA_ADDR.
	ModeCA Mode = "ca"
)

// credentialFiles are the three files a credentials directory must hold.
var credentialFiles = []string{"cert-chain.pem", "key.pem", "root-cert.pem"}

// sdsProbeTimeout is how long an existing SDS socket has to answer (SPEC 5.1).
const sdsProbeTimeout = time.Second

// ModeDecision is the certificate source chosen at start-up and why.
type ModeDecision struct {
	Mode   Mode   `json:"mode"`
	Reason string `json:"reason"`
	// Provider is CA_PROVIDER in ModeCA.
	Provider string `json:"provider,omitempty"`
	// StaleSocket is set when a socket at the SDS path answered nothing: `run`
	// removes it before serving; `config` only reports it.
	StaleSocket bool `json:"stale_socket,omitempty"`
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

// selectMode decides where certificates come from (SPEC 5), in this order:
// a healthy socket at the SDS path (another agent serves SDS), --dev, the
// workload credentials directory holding all three files,
// FILE_MOUNTED_CERTS=true, and otherwise the CA. It only looks: a stale
// socket is reported in the decision, not removed.
//
// --dev is considered after a healthy external socket so that trying the
// agent never takes a socket away from an agent that is serving it.
func selectMode(ctx context.Context, cfg *settings.Config) ModeDecision {
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
		return ModeDecision{Mode: ModeExternal, Reason: fmt.Sprintf("an SDS server already answers on %s; meshagent will not serve SDS there", cfg.SDSSocket)}
	case sockprobe.Stale:
		stale = true
		notes = append(notes, fmt.Sprintf("stale socket %s will be removed (%v)", cfg.SDSSocket, err))
	case sockprobe.NotSocket:
		notes = append(notes, fmt.Sprintf("SDS socket path unusable: %v", err))
	}
	decide := func(d ModeDecision) ModeDecision {
		d.StaleSocket = stale
		if len(notes) > 0 {
			d.Reason += "; " + strings.Join(notes, "; ")
		}
		return d
	}

	if cfg.Dev {
		return decide(ModeDecision{Mode: ModeDev, Reason: "--dev: an in-process CA with a fresh in-memory root, not for production"})
	}
	switch missing := missingFiles(cfg.WorkloadCredentialsDir); {
	case len(missing) == 0:
		return decide(ModeDecision{Mode: ModeWorkloadCredentials, Reason: fmt.Sprintf("%s holds %s", cfg.WorkloadCredentialsDir, strings.Join(credentialFiles, ", "))})
	case len(missing) < len(credentialFiles):
		notes = append(notes, fmt.Sprintf("%s is incomplete (missing %s)", cfg.WorkloadCredentialsDir, strings.Join(missing, ", ")))
	}
	if cfg.FileMountedCerts {
		return decide(ModeDecision{Mode: ModeFileMounted, Reason: fmt.Sprintf("FILE_MOUNTED_CERTS=true: serving %s", cfg.FileMountedCertsDir)})
	}
	return decide(ModeDecision{
		Mode:     ModeCA,
		Provider: cfg.CAProvider,
		Reason:   fmt.Sprintf("CA_PROVIDER=%s at CA_ADDR=%s", cfg.CAProvider, cfg.CAAddr),
	})
}
