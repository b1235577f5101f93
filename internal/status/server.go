package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/logkeys"
)

// Check reports a problem, or nil when all is well. It must return quickly.
type Check func() error

// CertInfo describes one certificate the agent holds: the certificate's
// facts, and in node mode how many pods use its identity.
type CertInfo struct {
	Cert
	// Pods is how many pods use the identity, in node mode; 0 otherwise.
	// Their names are not given: the list answers loopback callers only,
	// yet a pod's name is none of another pod's business.
	Pods int `json:"pods,omitempty"`
}

// Cert is what /debug/certs says of one certificate. Its fields are the
// secret manager's CertInfo's, field for field, so that one converts into
// the other with a type conversion, which stops compiling when either
// gains a field the other lacks.
type Cert struct {
	// ResourceName is the SDS resource name ("default", "file-cert:...").
	ResourceName string `json:"resource_name"`
	// Identity is the SPIFFE ID or DNS name the certificate is for.
	Identity string `json:"identity"`
	// Serial is the certificate's serial number in hexadecimal.
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	// RenewAt is when it will be replaced; zero when the agent does not renew it.
	RenewAt time.Time `json:"renew_at,omitzero"`
	// Source says where it came from: "ca", "dev-ca", "file", "output-certs".
	Source string `json:"source"`
}

// CertLister lists held certificates.
type CertLister interface {
	Certs() []CertInfo
}

// Config configures a Server. Zero values get the defaults noted.
type Config struct {
	// Addr is the listen address (host:port). Required: Run fails without
	// it (internal/app passes STATUS_PORT and MESHAGENT_STATUS_HOST).
	Addr string
	// Gatherer is what /metrics serves. Nil serves an empty registry.
	Gatherer prometheus.Gatherer
	// Logger; nil means no logging.
	Logger *zap.Logger
	// OnListen, when set, is called with the bound address once the server
	// listens (useful with port 0).
	OnListen func(net.Addr)
	// ShutdownTimeout bounds the graceful shutdown. Default 5s.
	ShutdownTimeout time.Duration
}

type namedCheck struct {
	name  string
	check Check
	// workload marks a check the workload itself makes pass (its first
	// stream through the xDS proxy): /healthz/started leaves it out.
	workload bool
}

// Server is the status HTTP server.
type Server struct {
	cfg     Config
	log     *zap.Logger
	handler http.Handler

	mu      sync.Mutex
	ready   []namedCheck
	live    []namedCheck
	listers []CertLister

	quit     chan struct{}
	quitOnce sync.Once
}

// New makes a Server; it starts nothing.
func New(cfg Config) *Server {
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger.Named("status"), quit: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz/ready", s.serveReady)
	mux.HandleFunc("GET /healthz/live", s.serveLive)
	mux.HandleFunc("GET /healthz/started", s.serveStarted)
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	mux.Handle("GET /debug/certs", s.loopbackOnly(http.HandlerFunc(s.serveCerts)))
	mux.Handle("/debug/pprof/", s.loopbackOnly(http.HandlerFunc(pprof.Index)))
	mux.Handle("/debug/pprof/cmdline", s.loopbackOnly(http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("/debug/pprof/profile", s.loopbackOnly(http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", s.loopbackOnly(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", s.loopbackOnly(http.HandlerFunc(pprof.Trace)))
	mux.Handle("/quitquitquit", s.loopbackOnly(http.HandlerFunc(s.serveQuit)))
	s.handler = mux
	return s
}

// AddReadiness registers a check that must pass before /healthz/ready answers 200.
func (s *Server) AddReadiness(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = append(s.ready, namedCheck{name: name, check: c})
}

// AddWorkloadReadiness registers a readiness check that only the workload
// beside the agent can make pass, such as the xDS proxy's first answer from
// the control plane, which comes once the workload opens its stream.
// /healthz/ready waits for it; /healthz/started, the startup probe of a
// native sidecar that the workload starts after, does not.
func (s *Server) AddWorkloadReadiness(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = append(s.ready, namedCheck{name: name, check: c, workload: true})
}

// AddLiveness registers a check whose failure makes /healthz/live answer 503.
func (s *Server) AddLiveness(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live = append(s.live, namedCheck{name: name, check: c})
}

// AddCertLister adds certificates to /debug/certs.
func (s *Server) AddCertLister(l CertLister) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listers = append(s.listers, l)
}

// Run listens on Config.Addr and serves until ctx ends or a loopback caller
// POSTs /quitquitquit; both return nil after a graceful shutdown. It returns
// an error when it cannot listen or serving fails.
func (s *Server) Run(ctx context.Context) error {
	if s.cfg.Addr == "" {
		return errors.New("status server: no Config.Addr to listen on")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("status server: %w", err)
	}
	s.log.Info("status server listening", zap.String(logkeys.Addr, ln.Addr().String()))
	if s.cfg.OnListen != nil {
		s.cfg.OnListen(ln.Addr())
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(s.log),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err := <-served:
		return fmt.Errorf("status server: %w", err)
	case <-ctx.Done():
	case <-s.quit:
		s.log.Info("quit requested")
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("status server: %w", err)
	}
	s.log.Info("status server stopped")
	return nil
}

// Quit makes Run return nil, as a POST to /quitquitquit does.
func (s *Server) Quit() { s.quitOnce.Do(func() { close(s.quit) }) }

func (s *Server) checks(live bool) []namedCheck {
	s.mu.Lock()
	defer s.mu.Unlock()
	if live {
		return slices.Clone(s.live)
	}
	return slices.Clone(s.ready)
}

// failures runs checks and returns one line per failing check.
func failures(checks []namedCheck) []string {
	var out []string
	for _, c := range checks {
		if err := c.check(); err != nil {
			out = append(out, c.name+": "+strings.Join(strings.Fields(err.Error()), " "))
		}
	}
	return out
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	answerChecks(w, s.checks(false), "ready")
}

// serveStarted answers 200 once every readiness check but the workload's
// passes: what a workload started after the agent needs from it.
func (s *Server) serveStarted(w http.ResponseWriter, _ *http.Request) {
	answerChecks(w, slices.DeleteFunc(s.checks(false), func(c namedCheck) bool { return c.workload }), "started")
}

// answerChecks answers 200 "<state>" when checks are registered and all
// pass, else 503 "not <state>" with why.
func answerChecks(w http.ResponseWriter, checks []namedCheck, state string) {
	if len(checks) == 0 {
		writeText(w, http.StatusServiceUnavailable, "not "+state+"\nno readiness checks registered\n")
		return
	}
	if f := failures(checks); len(f) > 0 {
		writeText(w, http.StatusServiceUnavailable, "not "+state+"\n"+strings.Join(f, "\n")+"\n")
		return
	}
	writeText(w, http.StatusOK, state+"\n")
}

func (s *Server) serveLive(w http.ResponseWriter, _ *http.Request) {
	if f := failures(s.checks(true)); len(f) > 0 {
		writeText(w, http.StatusServiceUnavailable, "not live\n"+strings.Join(f, "\n")+"\n")
		return
	}
	writeText(w, http.StatusOK, "live\n")
}

func (s *Server) serveCerts(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	listers := slices.Clone(s.listers)
	s.mu.Unlock()
	certs := []CertInfo{}
	for _, l := range listers {
		certs = append(certs, l.Certs()...)
	}
	slices.SortStableFunc(certs, func(a, b CertInfo) int {
		if c := strings.Compare(a.ResourceName, b.ResourceName); c != 0 {
			return c
		}
		return a.NotAfter.Compare(b.NotAfter)
	})
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(certs)
}

func (s *Server) serveQuit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeText(w, http.StatusMethodNotAllowed, "use POST\n")
		return
	}
	s.log.Info("quit requested over HTTP", zap.String(logkeys.RemoteAddr, r.RemoteAddr))
	writeText(w, http.StatusOK, "OK\n")
	s.Quit()
}

// loopbackOnly answers 403 to callers whose address is not a loopback address.
func (s *Server) loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isLoopback(r.RemoteAddr) {
			s.log.Warn("refused non-loopback caller", zap.String(logkeys.RemoteAddr, r.RemoteAddr), zap.String(logkeys.Path, r.URL.Path))
			writeText(w, http.StatusForbidden, "forbidden: loopback callers only\n")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func isLoopback(remoteAddr string) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return false
	}
	return ap.Addr().Unmap().IsLoopback()
}

func writeText(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}
