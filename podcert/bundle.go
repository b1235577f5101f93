package podcert

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
)

// BundleLabel is set on the ClusterTrustBundle the signer writes, for
// projected volumes that select bundles by label.
const BundleLabel = "meshagent.io/trust-bundle"

// publishBundle keeps the ClusterTrustBundle equal to the mesh's roots: at
// start, after every root change, every BundleResync, and after a failed
// write with backoff, until ctx ends.
func (s *Signer) publishBundle(ctx context.Context) {
	changed, stop := s.cfg.Roots.Watch()
	defer stop()
	failures := 0
	for {
		wait := s.cfg.BundleResync
		if err := s.ensureBundle(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = s.backoff.Delay(failures, s.cfg.Rand())
			failures++
			s.metrics.bundle.WithLabelValues(resultError).Inc()
			s.log.Warn("cannot publish the trust bundle", zap.String(logkeys.Bundle, BundleName(s.cfg.SignerName)),
				zap.Duration(logkeys.RetryIn, wait), zap.Error(err))
		} else {
			failures = 0
		}
		t := s.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
		case <-t.C():
		}
		t.Stop()
	}
}

// ensureBundle creates or updates the ClusterTrustBundle when it differs
// from the current roots. Several node agents write the same bundle; one
// that loses a race meets a conflict and tries again.
func (s *Signer) ensureBundle(ctx context.Context) error {
	name := BundleName(s.cfg.SignerName)
	roots, _ := s.cfg.Roots.Bundle()
	want := string(roots.PEM())
	cur, err := s.cfg.API.GetClusterTrustBundle(ctx, name)
	switch {
	case apierrors.IsNotFound(err):
		_, err = s.cfg.API.CreateClusterTrustBundle(ctx, &kubeclient.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{BundleLabel: "mesh-roots"}},
			Spec:       kubeclient.ClusterTrustBundleSpec{SignerName: s.cfg.SignerName, TrustBundle: want},
		})
		if err != nil {
			return fmt.Errorf("creating ClusterTrustBundle %s: %w", name, err)
		}
	case err != nil:
		return fmt.Errorf("reading ClusterTrustBundle %s: %w", name, err)
	case cur.Spec.TrustBundle == want:
		return nil
	default:
		cur.Spec.TrustBundle = want
		if _, err := s.cfg.API.UpdateClusterTrustBundle(ctx, cur); err != nil {
			return fmt.Errorf("updating ClusterTrustBundle %s: %w", name, err)
		}
	}
	s.metrics.bundle.WithLabelValues(resultSuccess).Inc()
	s.log.Info("trust bundle published", zap.String(logkeys.Bundle, name), zap.Int(logkeys.Roots, len(roots.Certs())))
	return nil
}
