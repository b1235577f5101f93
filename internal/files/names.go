// Package files names the credential files every directory of the agent's
// holds, whoever writes or reads it: the output directory
// (OUTPUT_CERTS), a provisioning certificate (PROV_CERT), pre-provisioned
// and file-mounted credentials, and the CA root beside them. Its
// subpackages watch, load, serve and write such files.
package files

// The names of the credential files in a directory, as pilot-agent and
// Istio's proxyless gRPC bootstrap use them.
const (
	// CertChainFile holds the certificate chain, leaf first, as PEM.
	CertChainFile = "cert-chain.pem"
	// KeyFile holds the private key as PKCS#8 PEM, mode 0600.
	KeyFile = "key.pem"
	// RootCertFile holds the trust bundle as PEM.
	RootCertFile = "root-cert.pem"
	// BundleMapFile is the SPIFFE trust bundle map (gRFC A87) written to the
	// output directory beside the others; the gRPC bootstrap's file_watcher
	// names it as spiffe_trust_bundle_map_file.
	BundleMapFile = "spiffe-bundle-map.json"
)
