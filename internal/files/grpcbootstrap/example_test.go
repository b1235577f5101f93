package grpcbootstrap_test

import (
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/meshagent/meshagent/internal/files/grpcbootstrap"
)

func ExampleGenerate() {
	data, err := grpcbootstrap.Generate(grpcbootstrap.Config{
		XDSSocket:    "./etc/istio/proxy/XDS",
		WorkDir:      "/opt/app",
		NodeID:       grpcbootstrap.SidecarNodeID("10.0.0.5", "echo-0", "apps", ""),
		NodeMetadata: map[string]any{"CLUSTER_ID": "Kubernetes"},
		CertDir:      "/var/lib/meshagent/certs",
		SecretTTL:    time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	var b struct {
		XDSServers []struct {
			ServerURI string `json:"server_uri"`
		} `json:"xds_servers"`
		CertificateProviders map[string]struct {
			Config struct {
				CertificateFile string `json:"certificate_file"`
				RefreshInterval string `json:"refresh_interval"`
			} `json:"config"`
		} `json:"certificate_providers"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		log.Fatal(err)
	}
	fmt.Println(b.XDSServers[0].ServerURI)
	fmt.Println(b.CertificateProviders["default"].Config.CertificateFile)
	fmt.Println(b.CertificateProviders["default"].Config.RefreshInterval)
	// Output:
	// unix:///opt/app/etc/istio/proxy/XDS
	// /var/lib/meshagent/certs/cert-chain.pem
	// 360s
}
