package app

// Log field keys.
const (
	keyVersion   = "version"
	keyMode      = "mode"   // sidecar or node (MESHAGENT_MODE)
	keySource    = "source" // where certificates come from
	keyReason    = "reason"
	keySigner    = "signer"
	keyBundle    = "bundle"
	keyComponent = "component"
	keyPath      = "path"
	keyIdentity  = "identity"
	keyRoot      = "root_serial"
	keySetting   = "setting"
	keyValue     = "value"

	keyServiceAccount = "service_account"
	keyPod            = "pod"
	keyAudience       = "audience"
	keyLifetime       = "lifetime"

	keyNode           = "node"
	keyNodeUIDs       = "node_uid_identities"
	keyCgroupRoot     = "cgroup_root"
	keyCgroupRootFrom = "cgroup_root_from"
)
