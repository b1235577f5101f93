package podcgroup

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Root is where the kubelet makes pod cgroups: one or more absolute cgroup
// paths, each ending in the kubepods component (/kubepods, /kubepods.slice,
// /x/kubepods for a kubelet with cgroupRoot /x, or kind's
// /kubelet.slice/kubelet-kubepods.slice). A process counts as in a pod only
// when its path starts with one of them exactly: a kubepods tree anywhere
// else (under a slice or scope whose owner may create cgroups, as systemd's
// Delegate=, nspawn or LXD allow) names no pod. The zero Root is
// DefaultRoot.
type Root struct {
	paths [][]string // components of each path, without the leading "/"
}

// DefaultRoot is what a kubelet without cgroupRoot uses: /kubepods with the
// cgroupfs driver, /kubepods.slice with the systemd driver, at the top of
// the hierarchy.
var DefaultRoot = Root{paths: [][]string{{"kubepods"}, {"kubepods.slice"}}}

// ParseRoot reads a comma-separated list of absolute cgroup paths, each
// ending in a kubepods component (kubepods, kubepods.slice or
// <parent>-kubepods.slice).
func ParseRoot(s string) (Root, error) {
	var r Root
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !strings.HasPrefix(p, "/") {
			return Root{}, fmt.Errorf("cgroup root %q is not an absolute path", p)
		}
		comps := strings.Split(strings.TrimSuffix(p[1:], "/"), "/")
		for _, c := range comps {
			if c == "" || c == "." || c == ".." {
				return Root{}, fmt.Errorf("cgroup root %q is not a clean path", p)
			}
		}
		if !isRoot(comps[len(comps)-1]) {
			return Root{}, fmt.Errorf("cgroup root %q does not end in kubepods, kubepods.slice or <parent>-kubepods.slice", p)
		}
		r.paths = append(r.paths, comps)
	}
	return r, nil
}

// ErrRootNotFound means the agent's own cgroup file names no pod, so no
// cgroup root can be learned from it.
var ErrRootNotFound = errors.New("the agent's own cgroup names no pod")

// LearnRoot returns the cgroup root of the agent's own pod, from the content
// of its /proc/self/cgroup: the path up to and including its kubepods
// component. The kubelet placed the agent, so whatever lies above that
// component is the kubelet's own cgroupRoot. It returns ErrRootNotFound when
// the agent is not in a pod's cgroup (or sees only its own cgroup namespace,
// where its path is "/").
func LearnRoot(data []byte) (Root, error) {
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.SplitN(line, ":", 3)
		if len(fields) != 3 || !strings.HasPrefix(fields[2], "/") {
			continue
		}
		comps := strings.Split(fields[2][1:], "/")
		for i, c := range comps {
			if c == ".." {
				break
			}
			if isRoot(c) {
				root := Root{paths: [][]string{slices.Clone(comps[:i+1])}}
				if _, ok, reason := root.parsePath(fields[2]); ok && reason == "" {
					return root, nil
				}
				break
			}
		}
	}
	return Root{}, ErrRootNotFound
}

// String returns the paths, comma-separated.
func (r Root) String() string {
	var b strings.Builder
	for i, p := range r.or().paths {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("/" + strings.Join(p, "/"))
	}
	return b.String()
}

func (r Root) or() Root {
	if len(r.paths) == 0 {
		return DefaultRoot
	}
	return r
}
