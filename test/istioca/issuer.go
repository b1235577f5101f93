package istioca

import "github.com/meshagent/meshagent/internal/localca"

// SetIssuer makes ca sign the certificates issued from now on, as a CA
// that moves to a new root does; the serving certificate stays
// (SetServingCert changes it) and so do RootPEM, Roots and CA.
func (s *Server) SetIssuer(ca *localca.CA) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.issuer = ca
}

// issuing is the CA that signs issued certificates now.
func (s *Server) issuing() *localca.CA {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.issuer != nil {
		return s.issuer
	}
	return s.ca
}
