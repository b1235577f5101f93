package trust

import (
	"context"
	"slices"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// world is one test's API server, its namespace and the agent's clients
// acting as the admin.
type world struct {
	env   *kubeenv.Env
	ns    string
	core  *kubeclient.Client
	certs *kubeclient.Certificates
}

func newWorld(t *testing.T) *world {
	t.Helper()
	env := kube.Env(t)
	ns := env.TestNamespace(t)
	core, err := kubeclient.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	certs, err := kubeclient.NewCertificates(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	return &world{env: env, ns: ns, core: core, certs: certs}
}

func (w *world) client() kubernetes.Interface { return w.env.Client() }

// run runs a source until the test ends.
func run(t *testing.T, r interface{ Run(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func newMerger(t *testing.T) (*Merger, *publisher) {
	t.Helper()
	pub := newPublisher()
	m, err := NewMerger(MergerConfig{Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	return m, pub
}

func published(t *testing.T, pub *publisher, want ...string) func() bool {
	return func() bool { return slices.Equal(subjects(t, pub.last()), want) }
}

func TestConfigMapSource(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a, b := newRoot(t, "a"), newRoot(t, "b")
	m, pub := newMerger(t)
	// The root file's roots are already in the merge, as in the agent.
	if err := m.Update("file", a); err != nil {
		t.Fatal(err)
	}
	src, err := NewConfigMapSource(ConfigMapConfig{Kube: w.core, Namespace: w.ns, Name: "istio-ca-root-cert", Key: "root-cert.pem", Sink: m})
	if err != nil {
		t.Fatal(err)
	}
	run(t, src)
	eventually(t, "the first list", src.HasSynced)

	cms := w.client().CoreV1().ConfigMaps(w.ns)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"},
		Data:       map[string]string{"root-cert.pem": string(a)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Another ConfigMap of the namespace is not read.
	if _, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Data:       map[string]string{"root-cert.pem": string(b)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	update := func(data map[string]string) {
		t.Helper()
		cm.Data = data
		if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The rotation: the new root beside the old one, then the new one
	// alone; the file still holds the old one, which stays until the file
	// changes too.
	update(map[string]string{"root-cert.pem": string(cat(a, b))})
	eventually(t, "a and b", published(t, pub, "a", "b"))
	update(map[string]string{"root-cert.pem": string(b)})
	if err := m.Update("file", b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b alone", published(t, pub, "b"))
	sets := pub.count()

	// Bad content, a missing key and a deleted ConfigMap are refused; the
	// ConfigMap's last good roots stay.
	update(map[string]string{"root-cert.pem": "not a bundle"})
	update(map[string]string{"other-key": string(a)})
	if err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Update("file", a); err != nil { // a later change shows the ConfigMap's b is still held
		t.Fatal(err)
	}
	eventually(t, "a and the ConfigMap's last good b", published(t, pub, "a", "b"))
	if pub.count() != sets+1 {
		t.Errorf("%d publications after the refusals, want %d", pub.count(), sets+1)
	}

	// Made again, it is followed again.
	if _, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"},
		BinaryData: map[string][]byte{"root-cert.pem": a},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a alone", published(t, pub, "a"))
}

func TestClusterTrustBundleSource(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	signer := "meshagent.io/" + w.ns
	prefix := strings.ReplaceAll(signer, "/", ":") + ":"
	a, b := newRoot(t, "a"), newRoot(t, "b")
	m, pub := newMerger(t)
	src, err := NewClusterTrustBundleSource(ClusterTrustBundleConfig{Kube: w.certs, Signer: signer, Sink: m})
	if err != nil {
		t.Fatal(err)
	}
	run(t, src)
	eventually(t, "the first list", src.HasSynced)

	ctbs := w.client().CertificatesV1().ClusterTrustBundles()
	create := func(name string, pem []byte, signer string) *certificatesv1.ClusterTrustBundle {
		t.Helper()
		ctb, err := ctbs.Create(ctx, &certificatesv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: string(pem)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ctbs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
		return ctb
	}
	old := create(prefix+"old", a, signer)
	eventually(t, "a", published(t, pub, "a"))
	// Bundles of another signer, or of none, are not read.
	create(strings.ReplaceAll(signer, "/", ":")+"-other:x", b, signer+"-other")
	create(w.ns+"-unsigned", b, "")

	// The rotation: the new root in a bundle of its own, then the old
	// bundle deleted.
	create(prefix+"new", b, signer)
	eventually(t, "a and b", published(t, pub, "b", "a")) // name order: new, old
	old.Spec.TrustBundle = string(cat(a, b))
	if _, err := ctbs.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ctbs.Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b alone", published(t, pub, "b"))

	// The last bundle deleted: the signer's last good roots stay.
	if err := ctbs.Delete(ctx, prefix+"new", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sets := pub.count()
	if err := m.Update("file", a); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b and a", published(t, pub, "b", "a"))
	if pub.count() != sets+1 {
		t.Errorf("%d publications, want %d", pub.count(), sets+1)
	}
}

// The API server checks a bundle's PEM when it is written, so a bad bundle
// cannot be made there; the source still refuses one alone, as it would
// one from a server that checks less.
func TestClusterTrustBundleSourceRefusesABadBundleAlone(t *testing.T) {
	a := newRoot(t, "a")
	m, pub := newMerger(t)
	src, err := NewClusterTrustBundleSource(ClusterTrustBundleConfig{Kube: &kubeclient.Certificates{}, Signer: "x/y", Sink: m})
	if err != nil {
		t.Fatal(err)
	}
	store := src.informer.GetStore()
	add := func(name, rv, pem string) {
		t.Helper()
		if err := store.Add(&kubeclient.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}, Spec: kubeclient.ClusterTrustBundleSpec{SignerName: "x/y", TrustBundle: pem}}); err != nil {
			t.Fatal(err)
		}
	}
	add("x:y:bad", "1", "junk")
	add("x:y:good", "1", string(a))
	src.recompute()
	if got := subjects(t, pub.last()); !slices.Equal(got, []string{"a"}) {
		t.Errorf("published %v", got)
	}
	if len(src.refused) != 1 {
		t.Errorf("refused %v", src.refused)
	}
}
