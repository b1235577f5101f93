package caclient

import "github.com/prometheus/client_golang/prometheus"

// NewRejectedAnswers returns meshagent_ca_answers_rejected_total{reason},
// the count of CA answers rejected before use (reason: pki.Reason of
// pki.VerifyIssued's error). Every part that judges a CA's answers (the
// certificate cache, the Pod Certificates signer) counts in it; registered
// through internal/promreg, they share the collector registered first.
func NewRejectedAnswers() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshagent_ca_answers_rejected_total",
		Help: "CA answers rejected before use, by reason.",
	}, []string{"reason"})
}
