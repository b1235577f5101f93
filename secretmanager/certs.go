package secretmanager

import (
	"sort"
	"strings"
	"time"
)

// CertInfo describes one held certificate for /debug/certs. Its fields are
// those of status.CertInfo, so one converts to the other.
type CertInfo struct {
	// ResourceName is the SDS resource name.
	ResourceName string `json:"resource_name"`
	// Identity is the workload identity, or a root's common name.
	Identity  string    `json:"identity"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	RenewAt   time.Time `json:"renew_at,omitzero"`
	Source    string    `json:"source"`
}

// Certs lists the certificate held for each identity (the own identity
// first, then by identity) and every root of the trust bundle.
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
	b := m.rootsBundle
	m.mu.Unlock()
	sort.Slice(helds, func(i, j int) bool {
		return strings.Compare(helds[i].secret.Identity.String(), helds[j].secret.Identity.String()) < 0
	})
	if own != nil {
		helds = append([]*held{own}, helds...)
	}
	out := make([]CertInfo, 0, len(helds)+len(b.Certs))
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
	roots := make([]CertInfo, 0, len(b.Certs))
	for _, c := range b.Certs {
		roots = append(roots, CertInfo{
			ResourceName: RootCertName,
			Identity:     c.Subject.CommonName,
			Serial:       c.SerialNumber.Text(16),
			NotBefore:    c.NotBefore.UTC(),
			NotAfter:     c.NotAfter.UTC(),
			Source:       b.Source,
		})
	}
	sort.SliceStable(roots, func(i, j int) bool { return roots[i].NotAfter.Before(roots[j].NotAfter) })
	return append(out, roots...)
}
