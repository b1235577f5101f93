package linkerdca

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
)

// TestTokenReview: with TokenReviews, a service-account token of audience
// identity.l5d.io proves its own account's identity, bound pod recorded; it
// does not prove another account's; a token of another audience, a token
// whose pod is gone, and a token that is not a Kubernetes token are refused
// with Linkerd's codes.
func TestTokenReview(t *testing.T) {
	env := kube.Env(t)
	ctx := context.Background()
	ns := env.TestNamespace(t)
	for _, sa := range []string{"web", "db"} {
		if _, err := env.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := env.CreatePod(ctx, ns, "web-0", "web", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	tokenFor := func(sa string, aud string) string {
		t.Helper()
		tok, err := env.Token(ctx, ns, sa, []string{aud}, pod, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	webTok := tokenFor("web", Audience)
	s := Start(t, Config{TokenReviews: env.Client().AuthenticationV1().TokenReviews()})
	c := dial(t, s)
	web, db := Identity(ns, "web"), Identity(ns, "db")
	csrFor := func(id pki.Identity) []byte {
		t.Helper()
		csr, err := pki.NewCSR(newKey(t), id)
		if err != nil {
			t.Fatal(err)
		}
		return csr
	}

	if _, err := certify(ctx, c, web.DNSName, webTok, csrFor(web)); err != nil {
		t.Fatalf("web with its own token: %v", err)
	}
	if _, err := certify(ctx, c, db.DNSName, webTok, csrFor(db)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("db with web's token: %v, want FailedPrecondition", err)
	}
	if _, err := certify(ctx, c, web.DNSName, tokenFor("web", "istio-ca"), csrFor(web)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("token of audience istio-ca: %v, want InvalidArgument", err)
	}
	if _, err := certify(ctx, c, web.DNSName, "not-a-jwt", csrFor(web)); status.Code(err) == codes.OK {
		t.Fatal("a token that is not a Kubernetes token was accepted")
	}
	if err := env.Client().CoreV1().Pods(ns).Delete(ctx, "web-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// The pod's deletion reaches the authenticator's cache asynchronously.
	testwait.Within(t, 30*time.Second, "a refusal of the token bound to the deleted pod", func() bool {
		_, err := certify(ctx, c, web.DNSName, webTok, csrFor(web))
		return status.Code(err) == codes.InvalidArgument || status.Code(err) == codes.FailedPrecondition
	})

	revs := s.Reviews()
	if len(revs) < 5 {
		t.Fatalf("%d reviews, want at least 5", len(revs))
	}
	first := revs[0]
	if !first.Authenticated || first.Username != "system:serviceaccount:"+ns+":web" || first.PodName != "web-0" || first.PodUID != string(pod.UID) || first.Identity != web.DNSName {
		t.Fatalf("first review %+v, want web's token bound to web-0 %s", first, pod.UID)
	}
	if revs[1].Username != first.Username || revs[1].Identity != db.DNSName {
		t.Fatalf("second review %+v, want web's token for db", revs[1])
	}
	if revs[2].Authenticated || revs[2].Err == "" {
		t.Fatalf("review of an istio-ca token %+v, want unauthenticated with an error", revs[2])
	}
}
