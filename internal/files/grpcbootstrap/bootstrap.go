package grpcbootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/atomicfile"
)

// Istio's names.
const (
	// ServerListenerNameTemplate is the listener a gRPC xDS server asks for;
	// gRPC replaces %s with its listening address.
	ServerListenerNameTemplate = "xds.istio.io/grpc/lds/inbound/%s"
	// CertProviderInstance is the certificate provider instance the control
	// plane's security configuration refers to.
	CertProviderInstance = "default"
	// FileWatcherPlugin is gRPC's file-based certificate provider.
	FileWatcherPlugin = "file_watcher"
	// DefaultGenerator is the node's GENERATOR metadata unless set: it asks
	// istiod for configuration in the form gRPC understands.
	DefaultGenerator = "grpc"
)

// Bounds of the file_watcher refresh interval.
const (
	MinRefreshInterval = time.Second
	MaxRefreshInterval = 900 * time.Second
	defaultSecretTTL   = 24 * time.Hour
)

// Locality is the node's locality.
type Locality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	SubZone string `json:"sub_zone,omitempty"`
}

// Config describes the bootstrap to generate.
type Config struct {
	// XDSSocket is the path of the agent's xDS proxy socket. A relative
	// path is resolved against WorkDir. Required.
	XDSSocket string
	// WorkDir resolves relative paths. Default: the process's working
	// directory.
	WorkDir string
	// NodeID is the node's ID, e.g. SidecarNodeID(...). Required.
	NodeID string
	// NodeMetadata is sent as the node's metadata; values must encode as
	// JSON. GENERATOR is set to DefaultGenerator unless present.
	NodeMetadata map[string]any
	// Locality is the node's locality, if known.
	Locality *Locality
	// CertDir is the OUTPUT_CERTS directory. Empty means no certificate
	// provider (the application can then only use plaintext). A relative
	// path is resolved against WorkDir.
	CertDir string
	// SPIFFEBundleMap names the SPIFFE trust bundle map in CertDir
	// (files.BundleMapFile) as the file_watcher's
	// spiffe_trust_bundle_map_file (gRFC A87).
	SPIFFEBundleMap bool
	// SecretTTL is the certificate lifetime the refresh interval is derived
	// from. Zero means 24h (SECRET_TTL's default).
	SecretTTL time.Duration
	// ServerListenerTemplate defaults to ServerListenerNameTemplate.
	ServerListenerTemplate string
}

// The bootstrap file's shape (gRFC A27, A29; grpc-go's bootstrap parser).
type bootstrap struct {
	XDSServers             []xdsServer             `json:"xds_servers"`
	Node                   node                    `json:"node"`
	CertificateProviders   map[string]certProvider `json:"certificate_providers,omitempty"`
	ServerListenerTemplate string                  `json:"server_listener_resource_name_template"`
}

type xdsServer struct {
	ServerURI      string         `json:"server_uri"`
	ChannelCreds   []channelCreds `json:"channel_creds"`
	ServerFeatures []string       `json:"server_features"`
}

type channelCreds struct {
	Type string `json:"type"`
}

type node struct {
	ID       string         `json:"id"`
	Metadata map[string]any `json:"metadata,omitempty"`
	Locality *Locality      `json:"locality,omitempty"`
}

type certProvider struct {
	PluginName string            `json:"plugin_name"`
	Config     fileWatcherConfig `json:"config"`
}

type fileWatcherConfig struct {
	CertificateFile   string `json:"certificate_file"`
	PrivateKeyFile    string `json:"private_key_file"`
	CACertificateFile string `json:"ca_certificate_file"`
	RefreshInterval   string `json:"refresh_interval"`
	// SPIFFETrustBundleMapFile is gRFC A87's per-trust-domain roots; gRPC
	// prefers it to CACertificateFile when its SPIFFE support is on.
	SPIFFETrustBundleMapFile string `json:"spiffe_trust_bundle_map_file,omitempty"`
}

// SidecarNodeID returns Istio's node ID for a workload:
// sidecar~<ip>~<pod>.<namespace>~<namespace>.svc.<dnsDomain>. An empty
// dnsDomain means cluster.local.
func SidecarNodeID(ip, pod, namespace, dnsDomain string) string {
	if dnsDomain == "" {
		dnsDomain = "cluster.local"
	}
	return "sidecar~" + ip + "~" + pod + "." + namespace + "~" + namespace + ".svc." + dnsDomain
}

// RefreshInterval is how often gRPC's file_watcher re-reads the certificate
// files for a certificate lifetime of ttl: a tenth of the lifetime, in whole
// seconds, clamped to [1s, 900s]. The agent renews at about half the lifetime
// (SECRET_GRACE_PERIOD_RATIO 0.5), so gRPC has the new certificate before 60 %
// of the old one's life has passed; 900 s is pilot-agent's fixed value, used
// for every lifetime of 2.5 h and more.
func RefreshInterval(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		ttl = defaultSecretTTL
	}
	r := (ttl / 10).Truncate(time.Second)
	return min(max(r, MinRefreshInterval), MaxRefreshInterval)
}

// Generate returns the bootstrap JSON for cfg.
func Generate(cfg Config) ([]byte, error) {
	if cfg.XDSSocket == "" {
		return nil, errors.New("grpcbootstrap: no xDS socket path")
	}
	if cfg.NodeID == "" {
		return nil, errors.New("grpcbootstrap: no node ID")
	}
	if cfg.WorkDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("grpcbootstrap: working directory: %w", err)
		}
		cfg.WorkDir = wd
	}
	if !filepath.IsAbs(cfg.WorkDir) {
		return nil, fmt.Errorf("grpcbootstrap: working directory %q is not absolute", cfg.WorkDir)
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return filepath.Clean(p)
		}
		return filepath.Join(cfg.WorkDir, p)
	}
	if cfg.ServerListenerTemplate == "" {
		cfg.ServerListenerTemplate = ServerListenerNameTemplate
	}
	md := make(map[string]any, len(cfg.NodeMetadata)+1)
	for k, v := range cfg.NodeMetadata {
		md[k] = v
	}
	if _, ok := md["GENERATOR"]; !ok {
		md["GENERATOR"] = DefaultGenerator
	}

	socket := abs(cfg.XDSSocket)
	if strings.ContainsAny(socket, "?#%") {
		return nil, fmt.Errorf("grpcbootstrap: xDS socket path %q cannot be written as a unix:// URI", socket)
	}
	b := bootstrap{
		XDSServers: []xdsServer{{
			// unix:// followed by the absolute path gives unix:///abs/path.
			ServerURI:      "unix://" + socket,
			ChannelCreds:   []channelCreds{{Type: "insecure"}},
			ServerFeatures: []string{"xds_v3"},
		}},
		Node:                   node{ID: cfg.NodeID, Metadata: md, Locality: cfg.Locality},
		ServerListenerTemplate: cfg.ServerListenerTemplate,
	}
	if cfg.CertDir != "" {
		dir := abs(cfg.CertDir)
		fw := fileWatcherConfig{
			CertificateFile:   filepath.Join(dir, files.CertChainFile),
			PrivateKeyFile:    filepath.Join(dir, files.KeyFile),
			CACertificateFile: filepath.Join(dir, files.RootCertFile),
			RefreshInterval:   fmt.Sprintf("%ds", int64(RefreshInterval(cfg.SecretTTL)/time.Second)),
		}
		if cfg.SPIFFEBundleMap {
			fw.SPIFFETrustBundleMapFile = filepath.Join(dir, files.BundleMapFile)
		}
		b.CertificateProviders = map[string]certProvider{
			CertProviderInstance: {PluginName: FileWatcherPlugin, Config: fw},
		}
	}
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("grpcbootstrap: encoding: %w", err)
	}
	return append(out, '\n'), nil
}

// WriteFile generates the bootstrap for cfg and writes it to path
// atomically (mode 0644), creating the directory if needed, unless the file
// already holds exactly that. It reports whether it wrote.
func WriteFile(path string, cfg Config) (bool, error) {
	data, err := Generate(cfg)
	if err != nil {
		return false, err
	}
	return writeFile(path, data)
}

func writeFile(path string, data []byte) (bool, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, fmt.Errorf("grpcbootstrap: creating directory: %w", err)
	}
	written, err := atomicfile.WriteIfChanged(path, data, 0o644)
	if err != nil {
		return false, fmt.Errorf("grpcbootstrap: %w", err)
	}
	return written, nil
}
