package secretmanager

import "github.com/meshagent/meshagent/internal/secret"

// The manager's API speaks of internal/secret's types, named here as the
// manager's callers have always named them.
type (
	// Secret is one SDS resource as held in memory (secret.Secret).
	Secret = secret.Secret
	// Roots is a trust bundle replaced at run time (secret.Roots).
	Roots = secret.Roots
	// RootSource gives the trust bundle in force (secret.RootSource).
	RootSource = secret.RootSource
	// Provider serves the names under a prefix (secret.Provider).
	Provider = secret.Provider
)

// Resource names served over SDS (secret's).
const (
	WorkloadCertName = secret.WorkloadCertName
	RootCertName     = secret.RootCertName
	FileCertPrefix   = secret.FileCertPrefix
	FileRootPrefix   = secret.FileRootPrefix
)

// ErrUnknownResource is wrapped by errors for a resource name the manager
// cannot serve; SDS answers them with InvalidArgument.
var ErrUnknownResource = secret.ErrUnknownResource
