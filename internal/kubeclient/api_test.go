package kubeclient

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func newNamespace(t *testing.T) string {
	t.Helper()
	return kube.Env(t).TestNamespace(t)
}

func adminClient(t *testing.T) *Client {
	t.Helper()
	c, err := NewForConfig(kube.Env(t).Config())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreateToken(t *testing.T) {
	env := kube.Env(t)
	ctx := context.Background()
	ns := newNamespace(t)
	if _, err := env.CreateServiceAccount(ctx, ns, "web"); err != nil {
		t.Fatal(err)
	}
	pod, err := env.CreatePod(ctx, ns, "web-0", "web", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	c := adminClient(t)
	secs := int64(3600)
	resp, err := c.CreateToken(ctx, ns, "web", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         []string{"istio-ca"},
		ExpirationSeconds: &secs,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if life := time.Until(resp.Status.ExpirationTimestamp.Time); life < 59*time.Minute || life > 61*time.Minute {
		t.Errorf("token lives %s, asked for an hour", life)
	}
	// The API server vouches for the token, its audience and its pod.
	tr, err := env.Client().AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: resp.Status.Token, Audiences: []string{"istio-ca"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Status.Authenticated || tr.Status.User.Username != "system:serviceaccount:"+ns+":web" {
		t.Fatalf("review: %+v", tr.Status)
	}
	if got := tr.Status.User.Extra["authentication.kubernetes.io/pod-uid"]; len(got) != 1 || got[0] != string(pod.UID) {
		t.Errorf("pod-uid %v, want %s", got, pod.UID)
	}

	// Errors are the API server's, typed.
	_, err = c.CreateToken(ctx, ns, "absent", &authenticationv1.TokenRequest{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("token of a missing account: %v, want NotFound", err)
	}
	anon, err := NewForConfig(env.ConfigForToken("not-a-token"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.CreateToken(ctx, ns, "web", &authenticationv1.TokenRequest{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("bad credentials: %v, want Unauthorized", err)
	}
}

func TestListAndWatchPods(t *testing.T) {
	env := kube.Env(t)
	ctx := context.Background()
	ns := newNamespace(t)
	// The client as the agent makes it: from a kubeconfig file.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.Kubeconfig(kubeconfig, env.AdminToken()); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Kubeconfig: kubeconfig, UserAgent: "meshagent/test"})
	if err != nil {
		t.Fatal(err)
	}
	on, err := env.CreatePod(ctx, ns, "on", "default", "node-list")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreatePod(ctx, ns, "off", "default", "node-other"); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListPods(ctx, ns, metav1.ListOptions{FieldSelector: "spec.nodeName=node-list"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.ResourceVersion == "" {
		t.Fatalf("list: %d pods, resource version %q", len(list.Items), list.ResourceVersion)
	}
	got := list.Items[0]
	if got.Name != "on" || got.Namespace != ns || got.UID != on.UID || got.Spec.ServiceAccountName != "default" ||
		got.Spec.NodeName != "node-list" || got.Status.Phase != PodPending || got.Labels["app"] != "on" {
		t.Errorf("listed pod %+v", got)
	}

	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w, err := c.WatchPods(wctx, ns, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	late, err := env.CreatePod(ctx, ns, "late", "default", "node-list")
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := <-w.ResultChan()
	if !ok {
		t.Fatal("watch ended")
	}
	p, isPod := ev.Object.(*Pod)
	if ev.Type != "ADDED" || !isPod || p.UID != late.UID || p.Spec.NodeName != "node-list" {
		t.Fatalf("event %s %#v", ev.Type, ev.Object)
	}
}

func TestPodInformer(t *testing.T) {
	env := kube.Env(t)
	ctx, cancel := context.WithCancel(context.Background())
	ns := newNamespace(t)
	c := adminClient(t)
	// The informer watches every namespace: the node is this test's own,
	// so pods an earlier run left (-count=2) are not on it.
	node := "node-informer-" + ns
	first, err := env.CreatePod(ctx, ns, "first", "default", node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreatePod(ctx, ns, "elsewhere", "default", "node-other"); err != nil {
		t.Fatal(err)
	}

	events := make(chan string, 16)
	inf := cache.NewSharedIndexInformerWithOptions(c.PodListWatch("spec.nodeName="+node), &Pod{}, cache.SharedIndexInformerOptions{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { events <- "add " + obj.(*Pod).Name },
		UpdateFunc: func(_, obj any) {
			p := obj.(*Pod)
			events <- "update " + p.Name + " " + string(p.Status.Phase)
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			events <- "delete " + obj.(*Pod).Name
		},
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()

	// next waits for want; updates of the pod it names are skipped (the
	// API server may write a pod, e.g. its deletion timestamp, before it
	// removes it).
	next := func(want string) {
		t.Helper()
		name := strings.Fields(want)[1]
		for {
			select {
			case got := <-events:
				if got == want {
					return
				}
				if !strings.HasPrefix(got, "update "+name+" ") {
					t.Fatalf("event %q, want %q", got, want)
				}
			case <-time.After(time.Minute):
				t.Fatalf("no event, want %q", want)
			}
		}
	}
	next("add first")
	second, err := env.CreatePod(ctx, ns, "second", "default", node)
	if err != nil {
		t.Fatal(err)
	}
	next("add second")
	second.Status.Phase = corev1.PodSucceeded
	if _, err := env.Client().CoreV1().Pods(ns).UpdateStatus(ctx, second, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	next("update second Succeeded")
	zero := int64(0)
	if err := env.Client().CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	next("delete first")
	keys := inf.GetStore().ListKeys()
	if len(keys) != 1 || keys[0] != ns+"/second" {
		t.Errorf("store %v, want only %s/second", keys, ns)
	}
}
