package settings

// pilotCertProviderUnused: kubernetes chose the Kubernetes CA bundle as the
// root in older pilot-agents; pilot-agent no longer does, and neither does
// meshagent. Say so, so that a control plane signed by the cluster CA is not
// a silent TLS failure.
func pilotCertProviderUnused(c *Config, _ bool) string {
	if c.PilotCertProvider != CertProviderKubernetes {
		return ""
	}
	return "treated as istiod: the CA root is " + c.CARoot + "; set CA_ROOT_CA and XDS_ROOT_CA to the bundle that signed the control plane's certificate if that is the cluster CA"
}

// tokenRequestOnly is the Unused check of a setting only the TokenRequest
// fetcher reads.
func tokenRequestOnly(c *Config, set bool) string {
	if !set || c.CredentialFetcherType == FetcherTokenRequest {
		return ""
	}
	return "only CREDENTIAL_FETCHER_TYPE=" + FetcherTokenRequest + " uses it; the token comes from the token file (MESHAGENT_TOKEN_PATH)"
}
