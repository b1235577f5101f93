package kubeclient

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodDeepCopyIsIndependent(t *testing.T) {
	now := metav1.Now()
	list := &PodList{
		ListMeta: metav1.ListMeta{ResourceVersion: "7"},
		Items: []Pod{{
			ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"app": "a"}, DeletionTimestamp: &now},
			Spec: PodSpec{ServiceAccountName: "sa", NodeName: "n", Volumes: []Volume{
				{Name: "socket", CSI: &CSIVolumeSource{Driver: "csi.example"}}, {Name: "data"},
			}},
			Status: PodStatus{Phase: PodRunning},
		}},
	}
	cp := list.DeepCopyObject().(*PodList)
	if !reflect.DeepEqual(cp.Items[0].Spec, list.Items[0].Spec) {
		t.Errorf("spec not copied: %+v", cp.Items[0].Spec)
	}
	cp.Items[0].Spec.Volumes[0].CSI.Driver = "changed"
	cp.Items[0].Spec.Volumes[1].Name = "changed"
	cp.Items[0].Labels["app"] = "changed"
	cp.Items[0].DeletionTimestamp.Time = cp.Items[0].DeletionTimestamp.Add(1)
	cp.Items[0].Status.Phase = PodFailed
	cp.ResourceVersion = "8"
	got := list.Items[0]
	if got.Labels["app"] != "a" || !got.DeletionTimestamp.Equal(&now) || got.Status.Phase != PodRunning || list.ResourceVersion != "7" {
		t.Errorf("the copy shares state with the original: %+v", list)
	}
	if v := got.Spec.Volumes; v[0].CSI.Driver != "csi.example" || v[1].Name != "data" {
		t.Errorf("the copy shares volumes with the original: %+v", v)
	}
	var nilPod *Pod
	if nilPod.DeepCopy() != nil {
		t.Error("copy of a nil pod")
	}
}

func TestPodCertificateRequestDeepCopyIsIndependent(t *testing.T) {
	maxExp := int32(3600)
	now := metav1.Now()
	r := &PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "r", Labels: map[string]string{"a": "b"}},
		Spec: PodCertificateRequestSpec{
			MaxExpirationSeconds: &maxExp, StubPKCS10Request: []byte{1, 2},
			UnverifiedUserAnnotations: map[string]string{"example.com/k": "v"},
		},
		Status: PodCertificateRequestStatus{Conditions: []metav1.Condition{{Type: "Issued"}}, NotBefore: &now},
	}
	list := &PodCertificateRequestList{Items: []PodCertificateRequest{*r}}
	cp := list.DeepCopyObject().(*PodCertificateRequestList).Items[0]
	*cp.Spec.MaxExpirationSeconds = 1
	cp.Spec.StubPKCS10Request[0] = 9
	cp.Spec.UnverifiedUserAnnotations["example.com/k"] = "changed"
	cp.Status.Conditions[0].Type = "Denied"
	cp.Status.NotBefore.Time = cp.Status.NotBefore.Add(1)
	cp.Labels["a"] = "changed"
	got := list.Items[0]
	if *got.Spec.MaxExpirationSeconds != 3600 || got.Spec.StubPKCS10Request[0] != 1 || got.Spec.UnverifiedUserAnnotations["example.com/k"] != "v" ||
		got.Status.Conditions[0].Type != "Issued" || !got.Status.NotBefore.Equal(&now) || got.Labels["a"] != "b" {
		t.Errorf("the copy shares state with the original: %+v", got)
	}
	b := &ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}}, Spec: ClusterTrustBundleSpec{TrustBundle: "x"}}
	bl := (&ClusterTrustBundleList{Items: []ClusterTrustBundle{*b}}).DeepCopyObject().(*ClusterTrustBundleList)
	bl.Items[0].Labels["a"] = "changed"
	if b.Labels["a"] != "b" || bl.Items[0].Spec.TrustBundle != "x" {
		t.Errorf("bundle copy: %+v", bl.Items[0])
	}
}

func TestConfigMapDeepCopyIsIndependent(t *testing.T) {
	list := &ConfigMapList{
		ListMeta: metav1.ListMeta{ResourceVersion: "3"},
		Items: []ConfigMap{{
			ObjectMeta: metav1.ObjectMeta{Name: "roots"},
			Data:       map[string]string{"root-cert.pem": "a"},
			BinaryData: map[string][]byte{"bin": []byte("b")},
		}},
	}
	cp := list.DeepCopyObject().(*ConfigMapList)
	list.Items[0].Data["root-cert.pem"] = "changed"
	list.Items[0].BinaryData["bin"][0] = 'x'
	list.Items[0].Name = "other"
	got := cp.Items[0]
	if got.Data["root-cert.pem"] != "a" || string(got.BinaryData["bin"]) != "b" || got.Name != "roots" || cp.ResourceVersion != "3" {
		t.Errorf("the copy changed with the original: %+v", got)
	}
	if (*ConfigMapList)(nil).DeepCopyObject() != nil || (*ConfigMap)(nil).DeepCopyObject() != nil {
		t.Error("a nil object's copy is not nil")
	}
	if empty := (&ConfigMapList{}).DeepCopyObject().(*ConfigMapList); empty.Items != nil {
		t.Errorf("a list without items copied to %v", empty.Items)
	}
}
