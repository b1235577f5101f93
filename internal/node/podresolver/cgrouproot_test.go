package podresolver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshagent/meshagent/internal/node/podcgroup"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// A node user with a delegated cgroup subtree names a cgroup after the
// victim's pod: refused under the kubelet's root, whichever it is; the same
// pod under the root is served.
func TestPodCgroupOnlyUnderTheKubeletRoot(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 200, 1, "8:pids:/machine.slice/x.scope/kubepods/besteffort/pod"+uidA+"/"+cid+"\n")
	fakeProc(t, root, 201, 1, "8:pids:/kubepods/besteffort/pod"+uidA+"/"+cid+"\n")
	fakeProc(t, root, 202, 1, "8:pids:/x/kubepods/besteffort/pod"+uidA+"/"+cid+"\n")
	pods := podMap{uidA: pod("vault", "vault-0", uidA, "vault", corev1.PodRunning)}
	custom, err := podcgroup.ParseRoot("/x/kubepods")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		root   podcgroup.Root
		served []int32
	}{
		{"default root", podcgroup.Root{}, []int32{201}},
		{"kubelet cgroupRoot /x", custom, []int32{202}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(Config{Pods: pods, ProcRoot: root, PodWait: time.Millisecond, CgroupRoot: tt.root})
			if err != nil {
				t.Fatal(err)
			}
			for _, pid := range []int32{200, 201, 202} {
				info, err := r.Resolve(context.Background(), caller.Cred{PID: pid, UID: 1000})
				served := pid == tt.served[0]
				if served {
					if err != nil || info.Pod != "vault/vault-0" {
						t.Errorf("pid %d: %+v, %v; want vault/vault-0", pid, info, err)
					}
					continue
				}
				wantRefusal(t, err, ReasonCgroup)
			}
		})
	}
}

func TestCgroupRoot(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inPod := write("in-pod", "0::/x/kubepods/burstable/pod"+uidA+"/"+cid+"\n")
	outside := write("outside", "0::/\n")
	for _, tt := range []struct {
		name, spec, self, want, from string
	}{
		{"configured wins", "/kubepods.slice", inPod, "/kubepods.slice", RootConfigured},
		{"learned from the agent's pod", "", inPod, "/x/kubepods", RootLearned},
		{"default outside a pod", "", outside, "/kubepods,/kubepods.slice", RootDefault},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, from, err := CgroupRoot(tt.spec, tt.self)
			if err != nil || root.String() != tt.want || from != tt.from {
				t.Fatalf("CgroupRoot = %s, %q, %v; want %s, %q", root, from, err, tt.want, tt.from)
			}
		})
	}
	if _, _, err := CgroupRoot("kubepods", outside); err == nil {
		t.Error("a relative root was accepted")
	}
	if _, _, err := CgroupRoot("", filepath.Join(dir, "missing")); err == nil {
		t.Error("an unreadable own cgroup was not reported")
	}
}

// A static pod's cgroup names the kubelet's manifest hash, which no pod of
// the API server has: refused at once, not after waiting PodWait for a pod
// that never comes.
func TestStaticPodRefusedAtOnce(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 300, 1, "0::/kubepods/burstable/pod3d8b5a0f0c1b4f8e8a7d1e2f3a4b5c6d/"+cid+"\n")
	r, err := New(Config{Pods: podMap{}, ProcRoot: root, PodWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = r.Resolve(ctx, caller.Cred{PID: 300})
	wantRefusal(t, err, ReasonStaticPod)
	if !strings.Contains(err.Error(), "static pod 3d8b5a0f0c1b4f8e8a7d1e2f3a4b5c6d") {
		t.Errorf("refusal %q does not say why", err)
	}
}
