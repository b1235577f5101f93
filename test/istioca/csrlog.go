package istioca

import (
	"slices"
	"time"
)

// CSRRecord is one CreateCertificate call as the CA saw it arrive.
type CSRRecord struct {
	// At is when it arrived (real time).
	At time.Time
	// Answered is when the answer (a certificate or an error) was
	// returned; zero while the call is in flight.
	Answered time.Time
	// Issued says the answer was a certificate.
	Issued bool
	// Identity is the URI SAN the CSR asks for, "" when the CSR does not
	// parse or asks for none, "(several)" when it asks for more than one.
	Identity string
}

// CSRs lists every CreateCertificate call received, accepted or not, in
// arrival order: what a CA budget is measured on.
func (s *Server) CSRs() []CSRRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.csrs)
}

func csrIdentity(pemCSR string) string {
	csr, err := parseCSR(pemCSR)
	if err != nil {
		return ""
	}
	switch len(csr.URIs) {
	case 0:
		return ""
	case 1:
		return csr.URIs[0].String()
	}
	return "(several)"
}

// MaxInFlight is the most CreateCertificate calls the CA has held at once,
// from arrival to answer: what a client's bound on concurrent CSRs is
// checked against.
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInFlight
}

// answered marks the call of CSRRecord i answered.
func (s *Server) answered(i int, issued bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	s.csrs[i].Answered = time.Now()
	s.csrs[i].Issued = issued
}
