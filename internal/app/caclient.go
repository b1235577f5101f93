package app

import (
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/settings"
)

// caClient builds the CA client for CA_PROVIDER: Linkerd's identity
// service, or Istio's certificate service. tokens is the agent's bearer
// token source; in node mode, pods is the pod index.
func (a *App) caClient(roots controlplane.RootSource, tokens tokenSource, pods *nodePods) (caclient.Client, error) {
	c := a.s
	t := controlplane.Config{Addr: c.CAAddr, Roots: roots, Metadata: map[string]string{}, Policy: c.CompliancePolicy}
	for k, v := range c.CAHeaders {
		t.Metadata[k] = v
	}
	if c.Scheme().IsLinkerd() {
		return a.linkerdClient(t, tokens, pods)
	}
	token, err := tokens()
	if err != nil {
		return nil, err
	}
	t.Token = token
	t.ServerName = c.IstiodSAN
	t.Plaintext = istio.PlaintextPort(c.CAAddr)
	if c.ClusterID != "" {
		t.Metadata["ClusterID"] = c.ClusterID
	}
	if c.ProvCert != "" {
		dir := c.ProvCert
		t.ClientCertificate = func() (*tls.Certificate, error) {
			p, err := certfile.LoadPair(filepath.Join(dir, files.CertChainFile), filepath.Join(dir, files.KeyFile), a.clock.Now())
			if err != nil {
				return nil, err
			}
			return p.TLSCertificate(), nil
		}
		t.TokenOptional = true
	}
	ic := istio.Config{Transport: t, CertSigner: c.CertSigner, Logger: a.base, Registerer: a.reg}
	if pods != nil {
		// The token is the agent's own: pods' certificates are asked on
		// their behalf (ImpersonatedIdentity).
		if ic.Identity, err = c.Identity(); err != nil {
			return nil, configError(err)
		}
	}
	return istio.New(ic)
}

// linkerdClient builds the client of Linkerd's identity service, which
// presents the scheme's server name unless
// MESHAGENT_LINKERD_IDENTITY_SERVICE_NAME says otherwise. In node mode each
// identity's CSR carries a token of its own service account
// (linkerdTokens); a sidecar sends its own token.
func (a *App) linkerdClient(t controlplane.Config, tokens tokenSource, pods *nodePods) (caclient.Client, error) {
	c := a.s
	t.ServerName = c.LinkerdIdentityServiceName
	lc := linkerd.Config{Transport: t, Scheme: c.Scheme(), Logger: a.base, Registerer: a.reg}
	if pods != nil {
		tokenFor, err := a.linkerdTokens(pods)
		if err != nil {
			return nil, err
		}
		lc.TokenFor = tokenFor
	} else {
		token, err := tokens()
		if err != nil {
			return nil, err
		}
		lc.Token = token
	}
	return linkerd.New(lc)
}

// tokenSource returns the agent's bearer token source, made at the first
// call (tokenFetcher): the CA client and the xDS proxy share it, so both
// send one cached TokenRequest token and a refusal by either renews it. A
// configuration where neither sends a token never makes it.
type tokenSource func() (credfetcher.Fetcher, error)

// tokenFetcher makes the source of the bearer token sent to the CA and to
// the control plane (CREDENTIAL_FETCHER_TYPE), with the Kubernetes client
// kube makes for TokenRequest tokens.
func (a *App) tokenFetcher(kube func() (*kubeclient.Client, error)) (credfetcher.Fetcher, error) {
	c := a.s
	if c.CredentialFetcherType != settings.FetcherTokenRequest {
		var f credfetcher.Fetcher = credfetcher.File{Path: c.TokenPath}
		if c.ProvCert != "" {
			f = a.unexpired(f)
		}
		return f, nil
	}
	if c.PodName == "" {
		return nil, configError(fmt.Errorf("CREDENTIAL_FETCHER_TYPE=%s needs POD_NAME: tokens are bound to the pod", settings.FetcherTokenRequest))
	}
	if c.PodNamespace == "" || c.ServiceAccount == "" {
		return nil, configError(fmt.Errorf("CREDENTIAL_FETCHER_TYPE=%s needs POD_NAMESPACE and SERVICE_ACCOUNT: tokens are asked for that service account", settings.FetcherTokenRequest))
	}
	client, err := kube()
	if err != nil {
		return nil, configError(fmt.Errorf("CREDENTIAL_FETCHER_TYPE=%s: %w", settings.FetcherTokenRequest, err))
	}
	f, err := credfetcher.NewTokenRequest(credfetcher.TokenRequestConfig{
		Client:         client,
		Namespace:      c.PodNamespace,
		ServiceAccount: c.ServiceAccount,
		PodName:        c.PodName,
		PodUID:         types.UID(c.PodUID),
		Audiences:      strings.Split(c.CredentialIdentityProvider, ","),
		Lifetime:       c.TokenLifetime,
		RefreshRatio:   c.TokenRefreshRatio,
		Clock:          a.clock,
		Logger:         a.base,
	})
	if err != nil {
		return nil, configError(settingError(err, tokenSettings))
	}
	a.log.Info("bearer tokens come from the Kubernetes TokenRequest API",
		zap.String(logkeys.ServiceAccount, c.PodNamespace+"/"+c.ServiceAccount),
		zap.String(logkeys.Pod, c.PodName), zap.String(logkeys.Audience, c.CredentialIdentityProvider),
		zap.Duration(logkeys.Lifetime, c.TokenLifetime))
	return f, nil
}

// unexpired keeps an expired token (a VM's onboarding token) from being
// sent: with PROV_CERT the certificate there authenticates the agent once
// the token is gone or expired, as pilot-agent's does (docs/vm.md).
func (a *App) unexpired(f credfetcher.Fetcher) credfetcher.Fetcher {
	path := a.s.TokenPath
	return &credfetcher.Unexpired{Fetcher: f, Now: a.clock.Now, OnExpired: func(exp time.Time) {
		a.log.Warn("bearer token expired; the certificate in PROV_CERT authenticates the agent",
			zap.String(logkeys.Path, path), zap.Time(logkeys.Expiry, exp), zap.String(logkeys.Dir, a.s.ProvCert))
	}}
}
