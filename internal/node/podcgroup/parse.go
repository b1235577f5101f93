package podcgroup

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrNotInPod means no line of the file names a pod: the process runs on the
// node outside any pod (or in a kubepods cgroup above the pod level).
var ErrNotInPod = errors.New("process is not in a pod's cgroup")

// Pod is where a process sits in the kubelet's cgroup tree.
type Pod struct {
	// UID is the pod's UID as the API server spells it (dashes, lower case).
	UID string
	// ContainerID is the runtime's container ID, without the runtime
	// prefix; empty when the process sits in the pod's own cgroup.
	ContainerID string
}

// Static reports whether the pod is a static pod of the kubelet (from a
// manifest file): its cgroup names the 32-hexadecimal-digit hash of the
// manifest, which is not the UID of any pod of the API server (the mirror
// pod the kubelet creates there has a UID of its own).
func (p Pod) Static() bool { return len(p.UID) == 32 }

// Error says why a cgroup file could not be read as a pod's.
type Error struct {
	// Line is the 1-based line of the file.
	Line int
	// Reason says what is wrong with it.
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cgroup line %d: %s", e.Line, e.Reason)
}

// Parse reads the content of /proc/<pid>/cgroup with pods under
// DefaultRoot; see Root.Parse.
func Parse(data []byte) (Pod, error) { return DefaultRoot.Parse(data) }

// Parse reads the content of /proc/<pid>/cgroup, with pods under r. It
// returns ErrNotInPod when no line names a pod, and an *Error when a line is
// malformed, a kubepods path has an unknown shape or sits outside r, a path
// is relative to the reader's cgroup namespace, or two lines name different
// pods or containers.
func (r Root) Parse(data []byte) (Pod, error) {
	r = r.or()
	var (
		found Pod
		have  bool
	)
	for i, line := range strings.Split(string(data), "\n") {
		if line == "" {
			continue
		}
		fields := strings.SplitN(line, ":", 3)
		if len(fields) != 3 || fields[0] == "" || !isDigits(fields[0]) {
			return Pod{}, &Error{Line: i + 1, Reason: "not <hierarchy>:<controllers>:<path>"}
		}
		p, ok, reason := r.parsePath(fields[2])
		if reason != "" {
			return Pod{}, &Error{Line: i + 1, Reason: reason}
		}
		if !ok {
			continue
		}
		if have && p.UID != found.UID {
			return Pod{}, &Error{Line: i + 1, Reason: "names a different pod than an earlier line"}
		}
		if have && p.ContainerID != found.ContainerID {
			return Pod{}, &Error{Line: i + 1, Reason: "names a different container than an earlier line"}
		}
		found, have = p, true
	}
	if !have {
		return Pod{}, ErrNotInPod
	}
	return found, nil
}

// parsePath reads one cgroup path. ok is false when the path names no pod;
// a non-empty reason means the path cannot be trusted or is under the root
// but not understood.
func (r Root) parsePath(path string) (p Pod, ok bool, reason string) {
	if !strings.HasPrefix(path, "/") {
		return Pod{}, false, "cgroup path is not absolute"
	}
	if path == "/" {
		return Pod{}, false, ""
	}
	comps := strings.Split(path[1:], "/")
	if comps[0] == ".." {
		// The process sits outside the reader's cgroup namespace, at a
		// place relative to it that cannot be checked against the root.
		return Pod{}, false, "cgroup path is relative to the agent's cgroup namespace (the agent must see the host's cgroup hierarchy)"
	}
	for _, root := range r.paths {
		if len(comps) < len(root) || !slices.Equal(comps[:len(root)], root) {
			continue
		}
		last := root[len(root)-1]
		rest := comps[len(root):]
		if stem, ok := strings.CutSuffix(last, ".slice"); ok {
			return parseSystemd(stem, rest)
		}
		return parseCgroupfs(rest)
	}
	if slices.ContainsFunc(comps, isRoot) {
		return Pod{}, false, "kubepods tree outside the kubelet's cgroup root " + r.String() + " is not trusted"
	}
	return Pod{}, false, ""
}

func isRoot(c string) bool {
	return c == "kubepods" || c == "kubepods.slice" || strings.HasSuffix(c, "-kubepods.slice")
}

// parseCgroupfs reads what follows /kubepods: [<qos>/]pod<uid>[/<container>[/...]].
func parseCgroupfs(rest []string) (Pod, bool, string) {
	if len(rest) > 0 && (rest[0] == "besteffort" || rest[0] == "burstable") {
		rest = rest[1:]
	}
	if len(rest) == 0 || rest[0] == "" {
		return Pod{}, false, ""
	}
	uid, found := strings.CutPrefix(rest[0], "pod")
	if !found {
		return Pod{}, false, "unknown component under kubepods"
	}
	if !validUID(uid) {
		return Pod{}, false, "pod UID is neither a UUID nor 32 hexadecimal digits"
	}
	p := Pod{UID: uid}
	if len(rest) > 1 {
		id, ok := containerID(rest[1], "", cgroupfsRuntimes)
		if !ok {
			return Pod{}, false, "container component is not a container ID of a known runtime ([crio-]<64 hexadecimal digits>)"
		}
		p.ContainerID = id
	}
	return p, true, ""
}

// parseSystemd reads what follows <stem>.slice:
// [<stem>-<qos>.slice/]<parent>-pod<uid>.slice[/<runtime>-<id>.scope[/...]].
func parseSystemd(stem string, rest []string) (Pod, bool, string) {
	parent := stem
	if len(rest) > 0 && (rest[0] == stem+"-besteffort.slice" || rest[0] == stem+"-burstable.slice") {
		parent = strings.TrimSuffix(rest[0], ".slice")
		rest = rest[1:]
	}
	if len(rest) == 0 || rest[0] == "" {
		return Pod{}, false, ""
	}
	name, found := strings.CutPrefix(rest[0], parent+"-pod")
	if !found {
		return Pod{}, false, "unknown component under kubepods"
	}
	name, found = strings.CutSuffix(name, ".slice")
	if !found {
		return Pod{}, false, "pod component is not a slice"
	}
	uid := strings.ReplaceAll(name, "_", "-")
	if strings.Contains(name, "-") || !validUID(uid) {
		return Pod{}, false, "pod UID is neither a UUID nor 32 hexadecimal digits"
	}
	p := Pod{UID: uid}
	if len(rest) > 1 {
		id, ok := containerID(rest[1], ".scope", systemdRuntimes)
		if !ok {
			return Pod{}, false, "container component is not a <runtime>-<id>.scope of a known runtime (cri-containerd, crio, docker; a 64-hexadecimal-digit id)"
		}
		p.ContainerID = id
	}
	return p, true, ""
}

// The container component is taken from an allow-list of what Kubernetes'
// container runtimes write, and nothing else is a pod's container: a
// runtime prefix (systemd driver: required, the component a .scope;
// cgroupfs driver: CRI-O's only) followed by the 64 lower-case hexadecimal
// digits of a CRI container ID. CRI-O's conmon scope (crio-conmon-<id>) is
// the runtime's monitor, not the pod's container; a component of another
// shape (another runtime's, a name chosen by whoever made the cgroup) is
// refused rather than taken for a container.
var (
	// systemdRuntimes are the <runtime>- prefixes of a systemd scope:
	// containerd, CRI-O, Docker (cri-dockerd).
	systemdRuntimes = []string{"cri-containerd-", "crio-", "docker-"}
	// cgroupfsRuntimes are the prefixes a cgroupfs container directory may
	// have: none (containerd, Docker) or CRI-O's.
	cgroupfsRuntimes = []string{"", "crio-"}
)

// containerIDLen is the length of a CRI container ID (hexadecimal).
const containerIDLen = 64

// containerID reads a container component: <runtime><id> with runtime one
// of runtimes, followed by suffix (which is then required).
func containerID(c, suffix string, runtimes []string) (string, bool) {
	c, found := strings.CutSuffix(c, suffix)
	if !found {
		return "", false
	}
	for _, p := range runtimes {
		if id, ok := strings.CutPrefix(c, p); ok && isContainerID(id) {
			return id, true
		}
	}
	return "", false
}

// isContainerID reports whether s is a CRI container ID: 64 lower-case
// hexadecimal digits.
func isContainerID(s string) bool {
	if len(s) != containerIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

// validUID accepts a lower-case UUID (8-4-4-4-12) or 32 lower-case
// hexadecimal digits (a static pod's UID is a hash of its manifest).
func validUID(s string) bool {
	switch len(s) {
	case 32:
		for i := 0; i < len(s); i++ {
			if !isHex(s[i]) {
				return false
			}
		}
		return true
	case 36:
		for i := 0; i < len(s); i++ {
			if i == 8 || i == 13 || i == 18 || i == 23 {
				if s[i] != '-' {
					return false
				}
			} else if !isHex(s[i]) {
				return false
			}
		}
		return true
	}
	return false
}

func isHex(b byte) bool { return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' }

func isAlnum(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
