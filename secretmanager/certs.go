package secretmanager

import (
	"sort"
	"strings"
	"time"
)

// CertInfo describes one certificate the manager holds, as /debug/certs
// shows it (the status server's CertInfo carries these fields and is
// converted from this type, so a field added here must be added there).
type CertInfo struct {
	// ResourceName is the SDS resource name ("default", "ROOTCA").
	ResourceName string
	// Identity is the SPIFFE ID or DNS name the certificate is for; a
	// root's subject common name.
	Identity string
	// Serial is the certificate's serial number in hexadecimal.
	Serial    string
	NotBefore time.Time
	NotAfter  time.Time
	// RenewAt is when it will be replaced; zero when the agent does not
	// renew it.
	RenewAt time.Time
	// Source says where it came from: "ca", "dev-ca", "file",
	// "output-certs".
	Source string
}

// Certs lists the certificate held for each identity (the own identity
// first, then by identity) and every root of the trust bundle, as
// /debug/certs shows them.
func (m *Manager) Certs() []CertInfo {
	m.mu.Lock()
	helds := make([]*held, 0, len(m.entries))
	var own *held
	for _, e := range m.entries {
		switch {
		case e.cert == nil:
		case e.own:
			own = e.cert
		default:
			helds = append(helds, e.cert)
		}
	}
	roots := m.roots
	m.mu.Unlock()
	sort.Slice(helds, func(i, j int) bool {
		return strings.Compare(helds[i].secret.Identity.String(), helds[j].secret.Identity.String()) < 0
	})
	if own != nil {
		helds = append([]*held{own}, helds...)
	}
	rootCerts := roots.Bundle.Certs()
	out := make([]CertInfo, 0, len(helds)+len(rootCerts))
	for _, h := range helds {
		leaf := h.chain[0]
		out = append(out, CertInfo{
			ResourceName: WorkloadCertName,
			Identity:     h.secret.Identity.String(),
			Serial:       leaf.SerialNumber.Text(16),
			NotBefore:    leaf.NotBefore.UTC(),
			NotAfter:     leaf.NotAfter.UTC(),
			RenewAt:      h.secret.RenewAt.UTC(),
			Source:       h.secret.Source,
		})
	}
	infos := make([]CertInfo, 0, len(rootCerts))
	for _, c := range rootCerts {
		infos = append(infos, CertInfo{
			ResourceName: RootCertName,
			Identity:     c.Subject.CommonName,
			Serial:       c.SerialNumber.Text(16),
			NotBefore:    c.NotBefore.UTC(),
			NotAfter:     c.NotAfter.UTC(),
			Source:       roots.Source,
		})
	}
	sort.SliceStable(infos, func(i, j int) bool { return infos[i].NotAfter.Before(infos[j].NotAfter) })
	return append(out, infos...)
}
