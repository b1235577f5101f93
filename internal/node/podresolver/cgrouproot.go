package podresolver

import (
	"errors"
	"fmt"
	"os"

	"github.com/meshagent/meshagent/internal/node/podcgroup"
)

// Where a cgroup root came from: the values CgroupRoot returns.
const (
	RootConfigured = "configured"
	RootLearned    = "learned from the agent's own pod"
	RootDefault    = "default"
)

// CgroupRoot returns the kubelet's cgroup root that callers' pods must sit
// under: spec when set (a comma-separated list of paths, see
// podcgroup.ParseRoot), else the root of the agent's own pod as its cgroup
// file selfCgroup (normally /proc/self/cgroup) shows it, else
// podcgroup.DefaultRoot. from says which of the three it is.
func CgroupRoot(spec, selfCgroup string) (root podcgroup.Root, from string, err error) {
	if spec != "" {
		root, err := podcgroup.ParseRoot(spec)
		return root, RootConfigured, err
	}
	data, err := os.ReadFile(selfCgroup)
	if err != nil {
		return podcgroup.Root{}, "", fmt.Errorf("reading the agent's own cgroup: %w", err)
	}
	root, err = podcgroup.LearnRoot(data)
	if errors.Is(err, podcgroup.ErrRootNotFound) {
		return podcgroup.DefaultRoot, RootDefault, nil
	}
	return root, RootLearned, err
}
