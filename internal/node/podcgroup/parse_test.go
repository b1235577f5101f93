package podcgroup

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

const (
	uid   = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
	uidU  = "0a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d"
	uid2  = "ffffffff-0000-4000-8000-000000000001"
	hash  = "3d8b5a0f0c1b4f8e8a7d1e2f3a4b5c6d"
	cid   = "9f2d6c1e0b8a4f3e2d1c0b9a8f7e6d5c4b3a29180f7e6d5c4b3a291807f6e5d4"
	cid2  = "1111111111111111111111111111111111111111111111111111111111111111"
	v1Top = "12:hugetlb:/\n11:memory:/\n"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Pod
	}{
		{"cgroupfs v1 besteffort", "8:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n", Pod{uid, cid}},
		{"cgroupfs v1 burstable", "8:pids:/kubepods/burstable/pod" + uid + "/" + cid + "\n", Pod{uid, cid}},
		{"cgroupfs v1 guaranteed has no qos", "8:pids:/kubepods/pod" + uid + "/" + cid + "\n", Pod{uid, cid}},
		{"cgroupfs v1 every hierarchy", "12:hugetlb:/kubepods/besteffort/pod" + uid + "/" + cid + "\n" +
			"11:memory:/kubepods/besteffort/pod" + uid + "/" + cid + "\n" +
			"1:name=systemd:/kubepods/besteffort/pod" + uid + "/" + cid + "\n", Pod{uid, cid}},
		{"cgroupfs v1 other hierarchies at root", v1Top + "8:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n0::/\n", Pod{uid, cid}},
		{"cgroupfs pod cgroup itself", "8:pids:/kubepods/besteffort/pod" + uid + "\n", Pod{UID: uid}},
		{"cgroupfs crio container", "0::/kubepods/burstable/pod" + uid + "/crio-" + cid + "\n", Pod{uid, cid}},
		{"cgroupfs static pod hash uid", "0::/kubepods/burstable/pod" + hash + "/" + cid + "\n", Pod{hash, cid}},
		{"cgroupfs nested below container", "0::/kubepods/pod" + uid + "/" + cid + "/init.scope\n", Pod{uid, cid}},
		{"systemd containerd", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", Pod{uid, cid}},
		{"systemd crio", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/crio-" + cid + ".scope\n", Pod{uid, cid}},
		{"systemd docker", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/docker-" + cid + ".scope\n", Pod{uid, cid}},
		{"systemd guaranteed", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", Pod{uid, cid}},
		{"systemd v1 hierarchies", "11:memory:/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n" +
			"1:name=systemd:/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", Pod{uid, cid}},
		{"systemd pod slice itself", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice\n", Pod{UID: uid}},
		{"no trailing newline", "0::/kubepods/pod" + uid + "/" + cid, Pod{uid, cid}},
		{"path with colon after pod", "0::/kubepods/pod" + uid + "/" + cid + "/a:b\n", Pod{uid, cid}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got != tt.want {
				t.Fatalf("Parse = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A kubelet with a cgroupRoot (or a node that is itself a container) puts
// pods below a prefix: accepted when the root names it.
func TestParseUnderRoot(t *testing.T) {
	tests := []struct {
		name, root, in string
		want           Pod
	}{
		{"kind cgroup root", "/kubelet.slice/kubelet-kubepods.slice", "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", Pod{uid, cid}},
		{"kind guaranteed", "/kubelet.slice/kubelet-kubepods.slice", "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", Pod{uid, cid}},
		{"node in a docker container", "/docker/" + cid2 + "/kubepods", "0::/docker/" + cid2 + "/kubepods/besteffort/pod" + uid + "/" + cid + "\n", Pod{uid, cid}},
		{"host view of kind node", "/system.slice/docker-" + cid2 + ".scope/kubelet.slice/kubelet-kubepods.slice", "0::/system.slice/docker-" + cid2 + ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", Pod{uid, cid}},
		{"kubelet cgroupRoot /x", "/x/kubepods", "8:pids:/x/kubepods/burstable/pod" + uid + "/" + cid + "\n", Pod{uid, cid}},
		{"second of two roots", "/a/kubepods, /x/kubepods", "8:pids:/x/kubepods/pod" + uid + "/" + cid + "\n", Pod{uid, cid}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, err := ParseRoot(tt.root)
			if err != nil {
				t.Fatal(err)
			}
			got, err := root.Parse([]byte(tt.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got != tt.want {
				t.Fatalf("Parse = %+v, want %+v", got, tt.want)
			}
			// Under the default root the same path is a nested tree.
			if _, err := Parse([]byte(tt.in)); err == nil {
				t.Fatal("accepted under the default root")
			}
		})
	}
}

func TestParseRoot(t *testing.T) {
	for _, bad := range []string{"", "kubepods", "/", "/x", "/x/../kubepods", "/x//kubepods", "/kubepods,", "/kubepods-helper.service"} {
		if r, err := ParseRoot(bad); err == nil {
			t.Errorf("ParseRoot(%q) = %v, want an error", bad, r)
		}
	}
	r, err := ParseRoot("/kubepods.slice , /x/kubepods/")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.String(); got != "/kubepods.slice,/x/kubepods" {
		t.Errorf("String = %q", got)
	}
	if got := (Root{}).String(); got != "/kubepods,/kubepods.slice" {
		t.Errorf("zero Root String = %q, want the default", got)
	}
}

// The agent learns the kubelet's root from its own pod's cgroup; outside a
// pod (or inside its own cgroup namespace, where it sees "/") there is
// nothing to learn.
func TestLearnRoot(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"cgroupfs top", v1Top + "8:pids:/kubepods/burstable/pod" + uid + "/" + cid + "\n0::/\n", "/kubepods"},
		{"cgroupRoot /x", "0::/x/kubepods/pod" + uid + "/" + cid + "\n", "/x/kubepods"},
		{"kind", "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", "/kubelet.slice/kubelet-kubepods.slice"},
		{"own cgroup namespace", "0::/\n", ""},
		{"node service", "0::/system.slice/meshagent.service\n", ""},
		{"kubepods without a pod", "0::/kubepods/besteffort\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := LearnRoot([]byte(tt.in))
			if tt.want == "" {
				if !errors.Is(err, ErrRootNotFound) {
					t.Fatalf("LearnRoot = %v, %v; want ErrRootNotFound", r, err)
				}
				return
			}
			if err != nil || r.String() != tt.want {
				t.Fatalf("LearnRoot = %v, %v; want %s", r, err, tt.want)
			}
		})
	}
}

func TestParseNotInPod(t *testing.T) {
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"v2 root", "0::/\n"},
		{"node service", "0::/system.slice/kubelet.service\n"},
		{"v1 hybrid outside pods", v1Top + "4:memory:/process_api/b38593b3e0f0876d680b29bcacab9031\n0::/\n"},
		{"kubepods root", "0::/kubepods\n"},
		{"qos cgroup", "0::/kubepods/besteffort\n"},
		{"systemd qos slice", "0::/kubepods.slice/kubepods-burstable.slice\n"},
		{"word kubepods inside a name", "0::/system.slice/kubepods-helper.service\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Parse([]byte(tt.in)); !errors.Is(err, ErrNotInPod) {
				t.Fatalf("Parse = %v, want ErrNotInPod", err)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	tests := []struct{ name, in, reason string }{
		{"two pods", "8:pids:/kubepods/pod" + uid + "/" + cid + "\n7:memory:/kubepods/pod" + uid2 + "/" + cid + "\n", "different pod"},
		{"two containers", "8:pids:/kubepods/pod" + uid + "/" + cid + "\n7:memory:/kubepods/pod" + uid + "/" + cid2 + "\n", "different container"},
		{"two pods v1 and v2", "8:pids:/kubepods/pod" + uid + "\n0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid2, "-", "_") + ".slice\n", "different pod"},
		{"no fields", "garbage\n", "not <hierarchy>"},
		{"hierarchy not a number", "x::/kubepods/pod" + uid + "\n", "not <hierarchy>"},
		{"relative path", "0::kubepods/pod" + uid + "\n", "not absolute"},
		{"short uid", "0::/kubepods/pod1234\n", "neither a UUID"},
		{"upper-case uid", "0::/kubepods/pod" + strings.ToUpper(uid) + "\n", "neither a UUID"},
		{"dashes misplaced", "0::/kubepods/pod0a1b2c3d4-e5f-4a6b-8c7d-9e0f1a2b3c4d\n", "neither a UUID"},
		{"unknown component", "0::/kubepods/guaranteed/pod" + uid + "\n", "unknown component"},
		{"systemd uid with dashes", "0::/kubepods.slice/kubepods-pod" + uid + ".slice\n", "neither a UUID"},
		{"systemd pod not a slice", "0::/kubepods.slice/kubepods-pod" + uidU + "\n", "not a slice"},
		{"systemd pod of another parent", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod" + uidU + ".slice\n", "unknown component"},
		{"systemd container not a scope", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + "\n", "not a <runtime>"},
		{"container with odd characters", "0::/kubepods/pod" + uid + "/../x\n", "not a container ID"},
		{"empty container", "0::/kubepods/pod" + uid + "//\n", "not a container ID"},
		// Only the runtimes' own names are containers (an allow-list):
		// anything else under a pod is refused, not taken for a container.
		{"systemd crio conmon", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/crio-conmon-" + cid + ".scope\n", "known runtime"},
		{"systemd unknown runtime", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/libpod-" + cid + ".scope\n", "known runtime"},
		{"systemd scope without runtime", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/" + cid + ".scope\n", "known runtime"},
		{"systemd short id", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-c0ffee.scope\n", "known runtime"},
		{"systemd upper-case id", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/docker-" + strings.ToUpper(cid) + ".scope\n", "known runtime"},
		{"cgroupfs name not an id", "0::/kubepods/pod" + uid + "/sandbox\n", "known runtime"},
		{"cgroupfs short id", "0::/kubepods/pod" + uid + "/c0ffee\n", "known runtime"},
		{"cgroupfs docker prefix", "0::/kubepods/pod" + uid + "/docker-" + cid + "\n", "known runtime"},
		{"user slice", "0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod" + uidU + ".slice/x-1.scope\n", "outside the kubelet's cgroup root"},
		// A user with a delegated subtree (systemd Delegate=, nspawn, LXD)
		// names a cgroup after another pod.
		{"delegated scope", "8:pids:/machine.slice/x.scope/kubepods/besteffort/pod" + uid + "/" + cid + "\n", "outside the kubelet's cgroup root"},
		{"delegated systemd shape", "0::/system.slice/foo.service/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", "outside the kubelet's cgroup root"},
		{"node in a docker container, default root", "0::/docker/" + cid2 + "/kubepods/pod" + uid + "\n", "outside the kubelet's cgroup root"},
		{"relative to cgroup namespace", "0::/../../kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n", "relative to the agent's cgroup namespace"},
		{"relative, no kubepods", "0::/../../../besteffort/pod" + uid + "/" + cid + "\n", "relative to the agent's cgroup namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.in))
			var perr *Error
			if !errors.As(err, &perr) {
				t.Fatalf("Parse = %v, want *Error", err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Fatalf("Parse error %q does not say %q", err, tt.reason)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"8:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n",
		"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n",
		"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + uidU + ".slice/crio-" + cid + ".scope\n",
		"0::/../kubepods/pod" + hash + "\n",
		v1Top + "0::/\n",
		"0::/user.slice/kubepods/pod" + uid + "\n",
		"8:pids:/machine.slice/x.scope/kubepods/besteffort/pod" + uid + "/" + cid + "\n",
		"0::/x/kubepods/pod" + uid + "\n",
	} {
		f.Add([]byte(s), "")
		f.Add([]byte(s), "/x/kubepods,/kubelet.slice/kubelet-kubepods.slice")
	}
	f.Fuzz(func(t *testing.T, data []byte, rootSpec string) {
		root := DefaultRoot
		if rootSpec != "" {
			var err error
			if root, err = ParseRoot(rootSpec); err != nil {
				return
			}
		}
		p, err := root.Parse(data)
		if err != nil {
			if p != (Pod{}) {
				t.Fatalf("Parse returned %+v with error %v", p, err)
			}
			return
		}
		if !validUID(p.UID) {
			t.Fatalf("Parse returned invalid UID %q", p.UID)
		}
		if !strings.Contains(string(data), p.UID) && !strings.Contains(string(data), strings.ReplaceAll(p.UID, "-", "_")) {
			t.Fatalf("UID %q does not appear in the input", p.UID)
		}
		if p.ContainerID != "" && !strings.Contains(string(data), p.ContainerID) {
			t.Fatalf("container ID %q does not appear in the input", p.ContainerID)
		}
		// Every line that names a kubepods tree starts at the root.
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.SplitN(line, ":", 3)
			if len(fields) < 3 || !slices.ContainsFunc(strings.Split(fields[2], "/"), isRoot) {
				continue
			}
			under := false
			for _, r := range strings.Split(root.String(), ",") {
				under = under || fields[2] == r || strings.HasPrefix(fields[2], r+"/")
			}
			if !under {
				t.Fatalf("accepted %+v from a line outside the root %s: %q", p, root, line)
			}
		}
		// A parsed file parses the same once more lines of other hierarchies
		// at their roots are added.
		again, err := root.Parse(append([]byte(v1Top), data...))
		if err != nil || again != p {
			t.Fatalf("with root lines added: %+v, %v; want %+v", again, err, p)
		}
	})
}

func TestContainerRuntime(t *testing.T) {
	tests := []struct {
		name, cgroup string
		want         bool
	}{
		{"docker, systemd driver", "0::/system.slice/docker-4f2c9a0b1d.scope\n", true},
		{"docker, cgroupfs driver", "0::/docker/4f2c9a0b1d\n", true},
		{"podman", "0::/machine.slice/libpod-8a7b6c.scope/container\n", true},
		{"rootless podman", "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-8a7b6c.scope\n", true},
		{"nerdctl", "0::/system.slice/nerdctl-1234.scope\n", true},
		{"cri-o outside pods", "0::/system.slice/crio-abc.scope\n", true},
		{"systemd-nspawn machine", "0::/machine.slice/machine-web.scope/payload\n", true},
		{"cgroup v1 docker line", "12:pids:/docker/abc\n11:cpu:/docker/abc\n", true},
		{"a node service", "0::/system.slice/nginx.service\n", false},
		{"the docker daemon itself", "0::/system.slice/docker.service\n", false},
		{"containerd itself", "0::/system.slice/containerd.service\n", false},
		{"a login session", "0::/user.slice/user-1000.slice/session-3.scope\n", false},
		{"the root cgroup", "0::/\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, got := ContainerRuntime([]byte(tt.cgroup)); got != tt.want {
				t.Errorf("ContainerRuntime(%q) = %q, %v, want %v", tt.cgroup, c, got, tt.want)
			}
		})
	}
}
