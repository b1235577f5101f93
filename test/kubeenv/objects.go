package kubeenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CreateNamespace creates a namespace and its "default" service account, which a
// cluster's controller manager would create and which pods without a service account
// name need (there is no controller manager here).
func (e *Env) CreateNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns, err := e.client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubeenv: creating namespace %s: %w", name, err)
	}
	if _, err := e.CreateServiceAccount(ctx, name, "default"); err != nil {
		return nil, err
	}
	return ns, nil
}

// TestNamespace creates a namespace for t, named after it with a random
// suffix (so that go test -count=2 and tests sharing a prefix never meet),
// and deletes it when t ends. A failure fails t.
func (e *Env) TestNamespace(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + "-" + randomHex(3)
	if _, err := e.CreateNamespace(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// CreateServiceAccount creates a service account.
func (e *Env) CreateServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	sa, err := e.client.CoreV1().ServiceAccounts(namespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubeenv: creating service account %s/%s: %w", namespace, name, err)
	}
	return sa, nil
}

// PodImage is the image of the pods CreatePod makes. Nothing pulls it: with no kubelet,
// pods stay Pending.
const PodImage = "registry.invalid/meshagent-test:none"

// CreatePod creates a pod running as serviceAccount, already bound to nodeName (as if
// scheduled there), and returns it as stored, with its UID.
func (e *Env) CreatePod(ctx context.Context, namespace, name, serviceAccount, nodeName string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			ServiceAccountName: serviceAccount,
			NodeName:           nodeName,
			Containers:         []corev1.Container{{Name: "app", Image: PodImage}},
		},
	}
	pod, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubeenv: creating pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// Token returns a TokenRequest token of a service account for the given audiences,
// bound to pod when pod is non-nil (the token then names the pod and its node, and
// dies with the pod). Zero ttl means the server's default (1 h); ttl below the API's 10-minute minimum is raised by the server.
func (e *Env) Token(ctx context.Context, namespace, serviceAccount string, audiences []string, pod *corev1.Pod, ttl time.Duration) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}
	if ttl > 0 {
		seconds := int64(ttl / time.Second)
		req.Spec.ExpirationSeconds = &seconds
	}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind:       "Pod",
			APIVersion: "v1",
			Name:       pod.Name,
			UID:        pod.UID,
		}
	}
	resp, err := e.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("kubeenv: token for %s/%s: %w", namespace, serviceAccount, err)
	}
	return resp.Status.Token, nil
}

// GrantOwnTokens gives service account sa of namespace ns the RBAC a sidecar
// agent needs for TokenRequest credentials: create on serviceaccounts/token
// for itself alone (a Role and RoleBinding named <sa>-own-tokens).
func (e *Env) GrantOwnTokens(ctx context.Context, ns, sa string) error {
	name := sa + "-own-tokens"
	if _, err := e.client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"},
			Verbs: []string{"create"}, ResourceNames: []string{sa},
		}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubeenv: role %s/%s: %w", ns, name, err)
	}
	if _, err := e.client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubeenv: role binding %s/%s: %w", ns, name, err)
	}
	return nil
}
