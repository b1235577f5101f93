package settings

import "path/filepath"

// validate refuses the combinations of settings that cannot work together,
// once every value is parsed and every default derived: the one place for
// rules that involve more than one setting. Each error is an InvalidError
// naming one of the settings, and says what to change.
func (r *resolution) validate() error {
	if err := r.validateRoots(); err != nil {
		return err
	}
	return r.validateNode()
}

// validateRoots: with PILOT_CERT_PROVIDER=none there is no default root
// for the CA or the xDS proxy to verify their peer with.
func (r *resolution) validateRoots() error {
	c := r.c
	if c.CARoot == "" && c.PilotCertProvider == CertProviderNone && !c.Dev && !c.FileMountedCerts {
		return r.invalid("PILOT_CERT_PROVIDER", c.PilotCertProvider, "no default CA root: set CA_ROOT_CA (a path, or SYSTEM) or PROV_CERT")
	}
	if c.XDSRoot == "" && c.XDSProxy {
		return r.invalid("PILOT_CERT_PROVIDER", c.PilotCertProvider, "no default xDS root: set XDS_ROOT_CA or CA_ROOT_CA (a path, or SYSTEM)")
	}
	return nil
}

// validateNode: node mode (docs/node-mode.md) serves the pods of one named
// node over the SDS socket; the Broker API is node mode's alone, on a
// socket in a directory of its own (the SDS socket's is mounted into every
// pod), for the brokers listed.
func (r *resolution) validateNode() error {
	c := r.c
	if c.Mode != ModeNode {
		if c.BrokerSocket != "" {
			return r.invalid("MESHAGENT_BROKER_SOCKET", c.BrokerSocket, "served in node mode only (MESHAGENT_MODE=node): unset it")
		}
		return nil
	}
	if c.BrokerSocket != "" {
		bdir, _ := filepath.Abs(filepath.Dir(c.BrokerSocket))
		sdir, _ := filepath.Abs(filepath.Dir(c.SDSSocket))
		if bdir == sdir {
			return r.invalid("MESHAGENT_BROKER_SOCKET", c.BrokerSocket, "in the SDS socket's directory, which every pod mounts: give it a directory of its own, mounted only into the brokers' pods")
		}
		if len(c.Brokers) == 0 {
			return r.invalid("MESHAGENT_BROKER_SOCKET", c.BrokerSocket, "MESHAGENT_BROKERS lists no broker: list the brokers' SPIFFE IDs, or unset MESHAGENT_BROKER_SOCKET")
		}
	}
	if c.NodeName == "" {
		return r.invalid("MESHAGENT_MODE", c.Mode, "needs NODE_NAME: only the pods of this node are served")
	}
	if c.DisableEnvoy {
		return r.invalid("MESHAGENT_MODE", c.Mode, "needs the SDS socket to serve the pods' certificates (DISABLE_ENVOY is set): unset DISABLE_ENVOY")
	}
	return nil
}
