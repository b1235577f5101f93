package secretmanager

import (
	"sort"
	"strings"

	"github.com/meshagent/meshagent/internal/status"
)

// Certs lists the certificate held for each identity (the own identity
// first, then by identity) and every root of the trust bundle, as
// /debug/certs shows them.
func (m *Manager) Certs() []status.CertInfo {
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
	out := make([]status.CertInfo, 0, len(helds)+len(rootCerts))
	for _, h := range helds {
		leaf := h.chain[0]
		out = append(out, status.CertInfo{
			ResourceName: WorkloadCertName,
			Identity:     h.secret.Identity.String(),
			Serial:       leaf.SerialNumber.Text(16),
			NotBefore:    leaf.NotBefore.UTC(),
			NotAfter:     leaf.NotAfter.UTC(),
			RenewAt:      h.secret.RenewAt.UTC(),
			Source:       h.secret.Source,
		})
	}
	infos := make([]status.CertInfo, 0, len(rootCerts))
	for _, c := range rootCerts {
		infos = append(infos, status.CertInfo{
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
