package app

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/podcert"
)

// linkerdRefusal is the denial of every PodCertificateRequest under
// CA_PROVIDER=Linkerd.
const linkerdRefusal = "CA_PROVIDER=Linkerd: Linkerd's identity service signs only a CSR naming the identity as its one DNS SAN, " +
	"and the kubelet's stub CSR names nothing (it is signed by the pod's own key, so the agent cannot make another); " +
	"pod certificates need an Istio-protocol CA"

// podCertificates builds the Pod Certificates signer of a node agent
// (MESHAGENT_POD_CERTIFICATE_SIGNER, docs/pod-certificates.md): it signs
// the PodCertificateRequests of the node's pods with the CA of src, on the
// pods' behalf. It publishes no trust: the signer's ClusterTrustBundle is
// `meshagent trust-publisher`'s (RunTrustPublisher). pods is node mode's
// pod index.
func (a *App) podCertificates(src certSource, pods *nodePods) ([]component, error) {
	c := a.s
	if c.PodCertificateSigner == "" || pods == nil {
		return nil, nil
	}
	if src.manager == nil || src.podRoots == nil {
		return nil, configError(errors.New("MESHAGENT_POD_CERTIFICATE_SIGNER needs node mode with a CA (the dev CA or CA_PROVIDER)"))
	}
	rc, err := kubeclient.RESTConfig(kubeclient.Config{Kubeconfig: c.Kubeconfig, UserAgent: "meshagent/" + a.cfg.Version})
	if err != nil {
		return nil, configError(fmt.Errorf("MESHAGENT_POD_CERTIFICATE_SIGNER: %w", err))
	}
	api, err := kubeclient.NewCertificates(rc)
	if err != nil {
		return nil, err
	}
	// A pod certificate is refreshed by the kubelet at beginRefreshAt:
	// SECRET_GRACE_PERIOD_RATIO=1 (renew at once) would have it refresh in a
	// loop, so pod certificates keep the default ratio then.
	ratio := c.GraceRatio
	if ratio >= 1 {
		ratio = settings.DefaultGraceRatio
	}
	pc := podcert.Config{
		SignerName:    c.PodCertificateSigner,
		NodeName:      c.NodeName,
		API:           api,
		Pods:          pods.idx,
		Roots:         src.podRoots,
		CA:            src.manager,
		TTL:           c.SecretTTL,
		RefreshRatio:  ratio,
		RefreshJitter: c.GraceJitter,
		Workers:       c.CAMaxConcurrentCSRs, // the budget is the manager's
		Logger:        a.base,
		Registerer:    a.reg,
	}
	if c.CAProvider == settings.ProviderLinkerd {
		pc.CA, pc.Refuse = nil, linkerdRefusal
		a.log.Warn("pod certificates: every request is denied", zap.String(logkeys.Reason, linkerdRefusal))
	}
	s, err := podcert.New(pc)
	if err != nil {
		return nil, configError(fmt.Errorf("MESHAGENT_POD_CERTIFICATE_SIGNER: %w", err))
	}
	a.status.AddReadiness("pod_certificates", func() error {
		if !s.HasSynced() {
			return errors.New("the node's PodCertificateRequests or pods are not listed yet")
		}
		return nil
	})
	a.log.Info("node mode: signing pod certificates", zap.String(logkeys.Signer, c.PodCertificateSigner))
	return []component{{name: "pod_certificates", run: s.Run}}, nil
}

// localCASigner issues pod certificates from the dev CA for the CSR's key.
// The dev CA's own client refuses a CSR that does not name the identity,
// and the kubelet's stub CSR names nothing.
type localCASigner struct{ ca *localca.CA }

func (l localCASigner) Sign(ctx context.Context, csrDER []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	csr, err := pki.ParseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	return l.ca.Issue(localca.Leaf{PublicKey: csr.PublicKey, Identity: id, TTL: ttl})
}
