package main

import (
	"fmt"
	"strings"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/settings"
)

// tokenFetcher returns the source of the bearer token sent to the CA and to
// the control plane (CREDENTIAL_FETCHER_TYPE). It is built once, so both
// share one cached TokenRequest token and a refusal by either renews it.
func (a *agent) tokenFetcher() (credfetcher.Fetcher, error) {
	if a.tokens != nil {
		return a.tokens, nil
	}
	c := a.cfg
	if c.CredentialFetcherType != settings.FetcherTokenRequest {
		a.tokens = credfetcher.File{Path: c.TokenPath}
		return a.tokens, nil
	}
	if c.PodName == "" {
		return nil, configError{fmt.Errorf("CREDENTIAL_FETCHER_TYPE=%s needs POD_NAME: tokens are bound to the pod", settings.FetcherTokenRequest)}
	}
	if c.PodNamespace == "" || c.ServiceAccount == "" {
		return nil, configError{fmt.Errorf("CREDENTIAL_FETCHER_TYPE=%s needs POD_NAMESPACE and SERVICE_ACCOUNT: tokens are asked for that service account", settings.FetcherTokenRequest)}
	}
	kube, err := kubeclient.New(kubeclient.Config{Kubeconfig: c.Kubeconfig, UserAgent: "meshagent/" + version})
	if err != nil {
		return nil, configError{fmt.Errorf("CREDENTIAL_FETCHER_TYPE=%s: %w", settings.FetcherTokenRequest, err)}
	}
	f, err := credfetcher.NewTokenRequest(credfetcher.TokenRequestConfig{
		Client:         kube,
		Namespace:      c.PodNamespace,
		ServiceAccount: c.ServiceAccount,
		PodName:        c.PodName,
		PodUID:         types.UID(c.PodUID),
		Audiences:      strings.Split(c.CredentialIdentityProvider, ","),
		Lifetime:       c.TokenLifetime,
		RefreshRatio:   c.TokenRefreshRatio,
		Logger:         a.base,
	})
	if err != nil {
		return nil, configError{err}
	}
	a.log.Info("bearer tokens come from the Kubernetes TokenRequest API",
		zap.String(keyServiceAccount, c.PodNamespace+"/"+c.ServiceAccount),
		zap.String(keyPod, c.PodName), zap.String(keyAudience, c.CredentialIdentityProvider),
		zap.Duration(keyLifetime, c.TokenLifetime))
	a.tokens = f
	return f, nil
}
