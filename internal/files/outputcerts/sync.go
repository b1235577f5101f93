package outputcerts

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

// Secrets is the agent's secret source as Sync uses it (secretmanager.Manager).
type Secrets interface {
	Current(id pki.Identity, name string) (*secret.Secret, error)
	Watch(id pki.Identity, name string) (<-chan struct{}, func())
}

// own asks Secrets for the agent's own identity.
var own pki.Identity

// SyncConfig configures a Sync.
type SyncConfig struct {
	// Secrets gives the workload certificate ("default", asked for with the
	// zero Identity: the agent's own) and the trust bundle ("ROOTCA").
	// Required.
	Secrets Secrets
	// Writer writes the files. Required.
	Writer *Writer
	// TrustDomain, when set, makes Sync write the roots as a SPIFFE trust
	// bundle map for this trust domain too (files.BundleMapFile). Optional.
	TrustDomain string
	// Hook, when set, is fired after every write that replaced files (a
	// rotation, a root change), once the files are in place. Optional.
	Hook Reloader
	// Logger is narrowed with .Named("outputcerts"). Nil means zap.NewNop().
	Logger *zap.Logger
	// Retry is how long after a failed write the files are written again,
	// without waiting for a change: a directory made writable again is
	// used (and readiness recovers) within it. Zero means DefaultRetry.
	Retry time.Duration
	// Clock times the retries. Nil means the real clock.
	Clock clock.Clock
}

// DefaultRetry is SyncConfig.Retry's default.
const DefaultRetry = 10 * time.Second

// Reloader tells an application that files were replaced (*Hook).
type Reloader interface {
	Fire(ctx context.Context, dir string, written []string) error
}

// Sync keeps the OUTPUT_CERTS directory equal to the agent's current
// workload certificate and trust bundle (docs/configuration.md): it writes what is held
// when it starts and again after every change signalled by the secret
// source. The Writer skips files whose content did not change.
type Sync struct {
	secrets Secrets
	w       *Writer
	hook    Reloader
	td      string
	log     *zap.Logger
	retry   time.Duration
	clock   clock.Clock
}

// NewSync checks cfg and returns a Sync. It starts nothing.
func NewSync(cfg SyncConfig) (*Sync, error) {
	if cfg.Secrets == nil || cfg.Writer == nil {
		return nil, errors.New("outputcerts: sync needs a secret source and a writer")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Sync{
		secrets: cfg.Secrets, w: cfg.Writer, hook: cfg.Hook, td: cfg.TrustDomain,
		log:   cfg.Logger.Named("outputcerts").With(zap.String(logkeys.Dir, cfg.Writer.Dir())),
		retry: cfg.Retry, clock: cfg.Clock,
	}, nil
}

// Run writes the files now and after every change until ctx ends, then
// returns nil. A failed write is logged (and counted by the Writer); it is
// tried again after Retry, or at the next change if that comes first. While no workload certificate is held, only the
// roots are written. The hook, if any, runs on Run's goroutine after each
// write that replaced files; the next write waits for it (at most its
// timeout).
func (s *Sync) Run(ctx context.Context) error {
	certs, stopCerts := s.secrets.Watch(own, secret.WorkloadCertName)
	defer stopCerts()
	roots, stopRoots := s.secrets.Watch(own, secret.RootCertName)
	defer stopRoots()
	for {
		var retry <-chan time.Time
		if !s.write(ctx) {
			retry = s.clock.After(s.retry)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-certs:
		case <-roots:
		case <-retry:
		}
	}
}

// write writes what the source holds now, waiting for nothing, and
// reports whether it succeeded (or had nothing to write).
func (s *Sync) write(ctx context.Context) bool {
	var f Files
	if cert, err := s.secrets.Current(own, secret.WorkloadCertName); err == nil {
		f.CertChain, f.Key = cert.CertChain, cert.PrivateKey
	}
	if root, err := s.secrets.Current(own, secret.RootCertName); err == nil {
		f.Root = root.Roots
		if s.td != "" {
			f.BundleMap = s.bundleMap(root.Roots)
		}
	}
	if f.CertChain == nil && f.Root == nil {
		return true
	}
	written, err := s.w.Write(f) // a failure is logged by the Writer
	// Only once every file of the change is in place: a half-done write
	// is not announced (the next change tries again, and fires then).
	if err == nil && len(written) > 0 && s.hook != nil {
		_ = s.hook.Fire(ctx, s.w.Dir(), written) // logged by the hook
	}
	return err == nil
}

// bundleMap is roots as a SPIFFE trust bundle map of the trust domain; nil
// (the file is left as it is) when they cannot be written as one.
func (s *Sync) bundleMap(roots []byte) []byte {
	certs, err := pki.ParseCertificates(roots)
	if err == nil {
		var m []byte
		if m, err = BundleMap(s.td, certs); err == nil {
			return m
		}
	}
	s.log.Warn("SPIFFE bundle map not written", zap.Error(err))
	return nil
}
