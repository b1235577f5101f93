package kubeclient

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodDeepCopyIsIndependent(t *testing.T) {
	now := metav1.Now()
	list := &PodList{
		ListMeta: metav1.ListMeta{ResourceVersion: "7"},
		Items: []Pod{{
			ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"app": "a"}, DeletionTimestamp: &now},
			Spec:       PodSpec{ServiceAccountName: "sa", NodeName: "n"},
			Status:     PodStatus{Phase: PodRunning},
		}},
	}
	cp := list.DeepCopyObject().(*PodList)
	cp.Items[0].Labels["app"] = "changed"
	cp.Items[0].DeletionTimestamp.Time = cp.Items[0].DeletionTimestamp.Add(1)
	cp.Items[0].Status.Phase = PodFailed
	cp.ResourceVersion = "8"
	got := list.Items[0]
	if got.Labels["app"] != "a" || !got.DeletionTimestamp.Equal(&now) || got.Status.Phase != PodRunning || list.ResourceVersion != "7" {
		t.Errorf("the copy shares state with the original: %+v", list)
	}
	if cp.Items[0].Spec != list.Items[0].Spec {
		t.Errorf("spec not copied: %+v", cp.Items[0].Spec)
	}
	var nilPod *Pod
	if nilPod.DeepCopy() != nil {
		t.Error("copy of a nil pod")
	}
}
